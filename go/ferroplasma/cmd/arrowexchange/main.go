// Command arrowexchange moves Arrow tables between Python and Go through
// the store (python/tests/test_languages.py runs it):
//
//	arrowexchange SOCKET read TABLE_HEX ARRAY_HEX
//	        prints "rows N", one checksum line per column, a line for the
//	        numpy array, and "outside K": how many column buffers (and the
//	        array's data) lie outside the objects' bytes in the store
//	arrowexchange SOCKET put HEX          puts a table Python then checks
package main

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"strconv"
	"unsafe"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"

	fp "github.com/ferroplasma/ferroplasma/go/ferroplasma"
)

func checksum(col []arrow.Array) string {
	var sum float64
	var count, nulls int
	for _, a := range col {
		nulls += a.NullN()
		for i := 0; i < a.Len(); i++ {
			if a.IsNull(i) {
				continue
			}
			count++
			switch v := a.(type) {
			case *array.Int64:
				sum += float64(v.Value(i))
			case *array.Float64:
				sum += v.Value(i)
			case *array.String:
				sum += float64(len(v.Value(i)))
			case *array.List:
				vals := v.ListValues().(*array.Int32)
				start, end := v.ValueOffsets(i)
				for j := start; j < end; j++ {
					sum += float64(vals.Value(int(j)))
				}
			default:
				return "unsupported type " + a.DataType().String()
			}
		}
	}
	return fmt.Sprintf("count=%d nulls=%d sum=%.3f", count, nulls, sum)
}

// outside counts buffers of d (and its children) not inside [lo, hi).
func outside(d arrow.ArrayData, lo, hi uintptr) int {
	n := 0
	for _, b := range d.Buffers() {
		if b == nil || b.Len() == 0 {
			continue
		}
		p := uintptr(unsafe.Pointer(&b.Bytes()[0]))
		if p < lo || p+uintptr(b.Len()) > hi {
			n++
		}
	}
	for _, c := range d.Children() {
		n += outside(c, lo, hi)
	}
	return n
}

func readArray(cl *fp.Client, hex string) (int, error) {
	id, err := fp.ParseID(hex)
	if err != nil {
		return 0, err
	}
	bufs, err := cl.Get([]fp.ObjectID{id}, 5_000_000_000)
	if err != nil || bufs[0] == nil {
		return 0, fmt.Errorf("get: %v", err)
	}
	defer bufs[0].Release()
	a, err := bufs[0].NDArray()
	if err != nil {
		return 0, err
	}
	var sum float64
	if a.Typestr == "<f8" {
		for i := 0; i+8 <= len(a.Data); i += 8 {
			sum += math.Float64frombits(binary.LittleEndian.Uint64(a.Data[i:]))
		}
	}
	order := 'C'
	if a.FortranOrder {
		order = 'F'
	}
	cols := uint64(1)
	if len(a.Shape) > 1 {
		cols = a.Shape[1]
	}
	fmt.Printf("array %s ndim=%d shape=%dx%d order=%c sum=%.3f\n", a.Typestr, len(a.Shape), a.Shape[0], cols, order, sum)
	raw := bufs[0].Bytes()
	lo := uintptr(unsafe.Pointer(&raw[0]))
	p := uintptr(unsafe.Pointer(&a.Data[0]))
	if p < lo || p+uintptr(len(a.Data)) > lo+uintptr(len(raw)) {
		return 1, nil
	}
	return 0, nil
}

func read(cl *fp.Client, hex, arrayHex string) error {
	id, err := fp.ParseID(hex)
	if err != nil {
		return err
	}
	bufs, err := cl.Get([]fp.ObjectID{id}, 5_000_000_000)
	if err != nil || bufs[0] == nil {
		return fmt.Errorf("get: %v", err)
	}
	defer bufs[0].Release()
	raw := bufs[0].Bytes()
	lo := uintptr(unsafe.Pointer(&raw[0]))
	hi := lo + uintptr(len(raw))
	t, err := cl.GetTable(id, 0)
	if err != nil {
		return err
	}
	defer t.Release()
	fmt.Printf("rows %d\n", t.NumRows())
	bad := 0
	for c, f := range t.Schema.Fields() {
		var col []arrow.Array
		for _, r := range t.Records {
			col = append(col, r.Column(c))
			bad += outside(r.Column(c).Data(), lo, hi)
		}
		fmt.Printf("column %s %s\n", f.Name, checksum(col))
	}
	n, err := readArray(cl, arrayHex)
	if err != nil {
		return err
	}
	fmt.Printf("outside %d\n", bad+n)
	return nil
}

func put(cl *fp.Client, hex string) error {
	id, err := fp.ParseID(hex)
	if err != nil {
		return err
	}
	schema := arrow.NewSchema([]arrow.Field{
		{Name: "i", Type: arrow.PrimitiveTypes.Int64, Nullable: true},
		{Name: "s", Type: arrow.BinaryTypes.String, Nullable: true},
		{Name: "l", Type: arrow.ListOf(arrow.PrimitiveTypes.Int32), Nullable: true},
	}, nil)
	b := array.NewRecordBuilder(memory.DefaultAllocator, schema)
	defer b.Release()
	ints := b.Field(0).(*array.Int64Builder)
	strs := b.Field(1).(*array.StringBuilder)
	lists := b.Field(2).(*array.ListBuilder)
	items := lists.ValueBuilder().(*array.Int32Builder)
	for i := 0; i < 1000; i++ {
		if i%7 == 0 {
			ints.AppendNull()
			strs.AppendNull()
			lists.AppendNull()
			continue
		}
		ints.Append(int64(i * 3))
		strs.Append("row " + strconv.Itoa(i))
		lists.Append(true)
		for j := 0; j < i%4; j++ {
			items.Append(int32(i + j))
		}
	}
	rec := b.NewRecordBatch()
	defer rec.Release()
	if err := cl.PutTable(id, schema, []arrow.RecordBatch{rec}); err != nil {
		return err
	}
	fmt.Println("put")
	return nil
}

func main() {
	if len(os.Args) < 4 {
		fmt.Fprintln(os.Stderr, "usage: arrowexchange SOCKET read TABLE_HEX ARRAY_HEX | put HEX")
		os.Exit(2)
	}
	cl, err := fp.Connect(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer cl.Close()
	switch os.Args[2] {
	case "read":
		if len(os.Args) != 5 {
			err = fmt.Errorf("read needs TABLE_HEX ARRAY_HEX")
			break
		}
		err = read(cl, os.Args[3], os.Args[4])
	case "put":
		err = put(cl, os.Args[3])
	default:
		err = fmt.Errorf("unknown mode %q", os.Args[2])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
