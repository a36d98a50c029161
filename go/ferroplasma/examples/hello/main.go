package main

import (
	"fmt"
	"os"

	fp "github.com/ferroplasma/ferroplasma/go/ferroplasma"
)

func main() {
	cl, err := fp.Connect(os.Args[1])
	if err != nil {
		panic(err)
	}
	defer cl.Close()
	id := fp.RandomID()
	if err := cl.Put(id, []byte("hello"), nil); err != nil {
		panic(err)
	}
	bufs, _ := cl.Get([]fp.ObjectID{id}, -1)
	fmt.Println(string(bufs[0].Bytes())) // the store's bytes, not a copy
	bufs[0].Release()
	_ = cl.Delete(id)
}
