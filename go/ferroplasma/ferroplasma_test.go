package ferroplasma

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
	"unsafe"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
)

// startStore runs a real store (FERROPLASMA_BIN, else the repository's
// target/release/ferroplasma) until the test ends.
func startStore(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("FERROPLASMA_BIN")
	if bin == "" {
		bin, _ = filepath.Abs("../../target/release/ferroplasma")
	}
	sock := filepath.Join(t.TempDir(), "store.sock")
	cmd := exec.Command(bin, "store", "--memory", "64MiB", "--socket", sock)
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v (build it: make build)", bin, err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for i := 0; i < 500; i++ {
		if c, err := Connect(sock); err == nil {
			c.Close()
			return sock
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("the store did not start")
	return ""
}

func status(err error) int {
	var e *Error
	if errors.As(err, &e) {
		return e.Status
	}
	return -1
}

func TestObjectsAndErrors(t *testing.T) {
	if _, err := Connect(filepath.Join(t.TempDir(), "none.sock")); status(err) != StatusStoreUnavailable {
		t.Fatalf("connect without a store: %v", err)
	}
	cl, err := Connect(startStore(t))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	id := RandomID()
	if err := cl.Put(id, []byte("hello"), []byte("m")); err != nil {
		t.Fatal(err)
	}
	if err := cl.Put(id, []byte("again"), nil); status(err) != StatusObjectExists {
		t.Fatalf("second put: %v", err)
	}
	missing := RandomID()
	bufs, err := cl.Get([]ObjectID{id, missing}, 0)
	if err != nil || bufs[1] != nil || !bytes.Equal(bufs[0].Bytes(), []byte("hello")) ||
		!bytes.Equal(bufs[0].Metadata(), []byte("m")) || bufs[0].ID() != id {
		t.Fatalf("get: %v %v", bufs, err)
	}
	bufs[0].Release()

	m, err := cl.Create(RandomID(), 4, nil)
	if err != nil {
		t.Fatal(err)
	}
	copy(m.Bytes(), "abcd")
	if err := cl.Seal(m); err != nil {
		t.Fatal(err)
	}
	if ok, err := cl.Contains(id); !ok || err != nil {
		t.Fatalf("contains: %v %v", ok, err)
	}
	if err := cl.Delete(id); err != nil {
		t.Fatal(err)
	}
	if ok, _ := cl.Contains(id); ok {
		t.Fatal("still there after delete")
	}
	if _, err := ParseID("xyz"); status(err) != StatusInvalidArgument {
		t.Fatalf("bad id: %v", err)
	}
	if got, err := ParseID(id.Hex()); err != nil || got != id {
		t.Fatalf("hex round trip: %v", err)
	}
	if s, err := cl.Stats(); err != nil || s.Capacity == 0 || s.Objects != 1 {
		t.Fatalf("stats: %+v %v", s, err)
	}
}

func TestArrowTablesRoundTripWithoutCopies(t *testing.T) {
	cl, err := Connect(startStore(t))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	schema := arrow.NewSchema([]arrow.Field{
		{Name: "x", Type: arrow.PrimitiveTypes.Int64, Nullable: true},
		{Name: "s", Type: arrow.BinaryTypes.String, Nullable: true},
	}, nil)
	b := array.NewRecordBuilder(memory.DefaultAllocator, schema)
	defer b.Release()
	b.Field(0).(*array.Int64Builder).AppendValues([]int64{1, 2, 3}, []bool{true, false, true})
	b.Field(1).(*array.StringBuilder).AppendValues([]string{"a", "", "ccc"}, nil)
	rec := b.NewRecordBatch()
	defer rec.Release()
	id := RandomID()
	if err := cl.PutTable(id, schema, []arrow.RecordBatch{rec}); err != nil {
		t.Fatal(err)
	}
	tab, err := cl.GetTable(id, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer tab.Release()
	if tab.NumRows() != 3 || !array.RecordEqual(tab.Records[0], rec) {
		t.Fatalf("got %v", tab.Records)
	}
	raw := tab.buf.Bytes()
	lo := uintptr(unsafe.Pointer(&raw[0]))
	vals := tab.Records[0].Column(1).Data().Buffers()[2].Bytes()
	if p := uintptr(unsafe.Pointer(&vals[0])); p < lo || p >= lo+uintptr(len(raw)) {
		t.Fatal("the string column's values were copied out of the store")
	}
	if _, err := cl.GetTable(RandomID(), 0); status(err) != StatusObjectNotFound {
		t.Fatalf("missing table: %v", err)
	}
}
