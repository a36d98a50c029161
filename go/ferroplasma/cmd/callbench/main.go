// Command callbench measures the per-call cost of the Go client, the same
// measures in every language (bench/calls.py runs it):
//
//	callbench SOCKET    prints {"get_ns":..,"contains_ns":..,"create_seal_ns":..,"batch_us":..}
package main

import (
	"fmt"
	"os"
	"sort"
	"time"

	fp "github.com/ferroplasma/ferroplasma/go/ferroplasma"
)

const (
	blocks    = 200
	perBlock  = 100
	batchSize = 1000
	batchReps = 50
)

func median(v []float64) float64 {
	sort.Float64s(v)
	return v[len(v)/2]
}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: callbench SOCKET")
		os.Exit(2)
	}
	cl, err := fp.Connect(os.Args[1])
	must(err)
	defer cl.Close()
	payload := make([]byte, 64)
	payload[0] = 1
	single := fp.RandomID()
	must(cl.Put(single, payload, nil))
	batch := make([]fp.ObjectID, batchSize)
	for i := range batch {
		batch[i] = fp.RandomID()
		must(cl.Put(batch[i], payload, nil))
	}
	ids := []fp.ObjectID{single}
	t := make([]float64, blocks)
	sink := 0

	for b := range t {
		t0 := time.Now()
		for i := 0; i < perBlock; i++ {
			got, err := cl.Get(ids, 0)
			must(err)
			sink += int(got[0].Bytes()[0])
			got[0].Release()
		}
		t[b] = float64(time.Since(t0).Nanoseconds()) / perBlock
	}
	getNs := median(t)

	for b := range t {
		t0 := time.Now()
		for i := 0; i < perBlock; i++ {
			has, err := cl.Contains(single)
			must(err)
			if has {
				sink++
			}
		}
		t[b] = float64(time.Since(t0).Nanoseconds()) / perBlock
	}
	containsNs := median(t)

	fresh := make([]fp.ObjectID, perBlock)
	for b := range t {
		for i := range fresh {
			fresh[i] = fp.RandomID()
		}
		t0 := time.Now()
		for _, id := range fresh {
			m, err := cl.Create(id, 64, nil)
			must(err)
			m.Bytes()[0] = 1
			must(cl.Seal(m))
		}
		t[b] = float64(time.Since(t0).Nanoseconds()) / perBlock
		must(cl.Delete(fresh...))
	}
	createSealNs := median(t)

	tb := make([]float64, batchReps)
	for r := range tb {
		t0 := time.Now()
		got, err := cl.Get(batch, 0)
		must(err)
		for _, b := range got {
			sink += int(b.Bytes()[0])
			b.Release()
		}
		tb[r] = float64(time.Since(t0).Nanoseconds()) / 1e3
	}
	batchUs := median(tb)

	must(cl.Delete(batch...))
	must(cl.Delete(single))
	fmt.Printf("{\"get_ns\": %.1f, \"contains_ns\": %.1f, \"create_seal_ns\": %.1f, \"batch_us\": %.2f}\n",
		getNs, containsNs, createSealNs, batchUs)
	if sink == -1 {
		os.Exit(3)
	}
}
