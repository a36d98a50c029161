// Package ferroplasma is the Go client of the ferroplasma shared-memory
// object store, over libferroplasma (the C library, `make c-lib`) with cgo.
//
// Objects are immutable once sealed; Get returns buffers whose Bytes are the
// store's shared memory itself (no copy), valid until Release. A Client may
// be used from many goroutines at once.
//
// Build with the C library on pkg-config's path:
//
//	PKG_CONFIG_PATH=$REPO/target/c/lib/pkgconfig CGO_LDFLAGS=-Wl,-rpath,$REPO/target/c/lib go build
package ferroplasma

/*
#cgo pkg-config: ferroplasma
#include <stdlib.h>
#include <ferroplasma.h>
*/
import "C"

import (
	"encoding/hex"
	"fmt"
	"time"
	"unsafe"
)

// ObjectID is a 20-byte object id, as in Plasma.
type ObjectID [20]byte

// RandomID returns a random id.
func RandomID() ObjectID {
	return fromC(C.fp_object_id_random())
}

func fromC(c C.fp_object_id) ObjectID {
	var id ObjectID
	for i, b := range c.bytes {
		id[i] = byte(b)
	}
	return id
}

// ParseID reads 40 hex digits.
func ParseID(s string) (ObjectID, error) {
	var id ObjectID
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != len(id) {
		return id, &Error{Status: int(C.FP_INVALID_ARGUMENT), Message: fmt.Sprintf("not 40 hex digits: %q", s)}
	}
	copy(id[:], b)
	return id, nil
}

// Hex is the id as 40 lowercase hex digits.
func (id ObjectID) Hex() string { return hex.EncodeToString(id[:]) }

func (id ObjectID) c() C.fp_object_id {
	var out C.fp_object_id
	for i, b := range id {
		out.bytes[i] = C.uint8_t(b)
	}
	return out
}

// Error is a failed call: the C library's status code and message.
type Error struct {
	Status  int
	Message string
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s: %s", C.GoString(C.fp_status_name(C.int32_t(e.Status))), e.Message)
}

// Status codes an Error may carry (the FP_* of ferroplasma.h).
const (
	StatusStoreUnavailable = int(C.FP_STORE_UNAVAILABLE)
	StatusObjectExists     = int(C.FP_OBJECT_EXISTS)
	StatusObjectNotFound   = int(C.FP_OBJECT_NOT_FOUND)
	StatusStoreFull        = int(C.FP_STORE_FULL)
	StatusInvalidArgument  = int(C.FP_INVALID_ARGUMENT)
	StatusNotHeld          = int(C.FP_NOT_HELD)
)

// check turns a status into an error. It must run on the thread that made
// the call (the message is per thread): callers lock the OS thread.
func check(s uint32) error {
	if s == C.FP_OK {
		return nil
	}
	return &Error{Status: int(s), Message: C.GoString(C.fp_last_error())}
}

// call runs f with the goroutine locked to its thread, so that the error
// message read after it is the one f's call left.
func call(f func() uint32) error {
	runtimeLockOSThread()
	defer runtimeUnlockOSThread()
	return check(f())
}

// Client is a connection to a store.
type Client struct {
	c *C.fp_client
}

// Connect connects to the store at socket ("": $FERROPLASMA_SOCKET, else
// /tmp/ferroplasma.sock).
func Connect(socket string) (*Client, error) {
	var path *C.char
	if socket != "" {
		path = C.CString(socket)
		defer C.free(unsafe.Pointer(path))
	}
	cl := &Client{}
	if err := call(func() uint32 { return C.fp_connect(path, &cl.c) }); err != nil {
		return nil, err
	}
	return cl, nil
}

// Close disconnects. Buffers got through the client stay valid until
// released.
func (cl *Client) Close() error {
	C.fp_disconnect(cl.c)
	cl.c = nil
	return nil
}

// Buffer is a sealed object's bytes in the store's shared memory. It holds
// a reference: the object is neither evicted nor freed until Release.
type Buffer struct {
	b *C.fp_buffer
}

// Bytes is the object's data, the store's memory itself (no copy), valid
// until Release. Do not write to it.
func (b *Buffer) Bytes() []byte {
	n := int(C.fp_buffer_size(b.b))
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(C.fp_buffer_data(b.b))), n)
}

// Metadata is the object's metadata, valid until Release.
func (b *Buffer) Metadata() []byte {
	n := int(C.fp_buffer_metadata_size(b.b))
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(C.fp_buffer_metadata(b.b))), n)
}

// ID is the object's id.
func (b *Buffer) ID() ObjectID { return fromC(C.fp_buffer_id(b.b)) }

// Release gives the reference back; Bytes and Metadata are invalid after.
func (b *Buffer) Release() {
	C.fp_buffer_release(b.b)
	b.b = nil
}

// MutableBuffer is an object being created: Bytes are writable until Seal
// or Abort.
type MutableBuffer struct {
	m *C.fp_mut_buffer
}

// Bytes is the object's writable data in the store.
func (m *MutableBuffer) Bytes() []byte {
	n := int(C.fp_mut_buffer_size(m.m))
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(C.fp_mut_buffer_data(m.m))), n)
}

func cbytes(b []byte) (*C.uint8_t, C.size_t) {
	if len(b) == 0 {
		return nil, 0
	}
	return (*C.uint8_t)(unsafe.Pointer(&b[0])), C.size_t(len(b))
}

// Create makes an object of size bytes of data (written through Bytes)
// and the given metadata. Seal or Abort it exactly once.
func (cl *Client) Create(id ObjectID, size uint64, metadata []byte) (*MutableBuffer, error) {
	cid := id.c()
	mp, mn := cbytes(metadata)
	m := &MutableBuffer{}
	err := call(func() uint32 {
		return C.fp_create(cl.c, &cid, C.uint64_t(size), mp, mn, &m.m)
	})
	if err != nil {
		return nil, err
	}
	return m, nil
}

// Seal makes the object immutable and visible to every client.
func (cl *Client) Seal(m *MutableBuffer) error {
	h := m.m
	m.m = nil
	return call(func() uint32 { return C.fp_seal(cl.c, h, nil) })
}

// Abort discards an object being created.
func (cl *Client) Abort(m *MutableBuffer) error {
	h := m.m
	m.m = nil
	return call(func() uint32 { return C.fp_abort(cl.c, h) })
}

// Put creates, fills and seals an object in one call.
func (cl *Client) Put(id ObjectID, data, metadata []byte) error {
	cid := id.c()
	dp, dn := cbytes(data)
	mp, mn := cbytes(metadata)
	return call(func() uint32 { return C.fp_create_and_seal(cl.c, &cid, dp, dn, mp, mn) })
}

// Get gets objects, waiting up to timeout for those not sealed yet
// (negative: forever; 0: not at all). An object not sealed in time is nil.
// Release every non-nil buffer.
func (cl *Client) Get(ids []ObjectID, timeout time.Duration) ([]*Buffer, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	cids := make([]C.fp_object_id, len(ids))
	for i, id := range ids {
		cids[i] = id.c()
	}
	// C memory for the result: cgo forbids passing Go memory that will
	// hold C pointers.
	out := (*[1 << 28]*C.fp_buffer)(C.calloc(C.size_t(len(ids)), C.size_t(unsafe.Sizeof(uintptr(0)))))[:len(ids):len(ids)]
	defer C.free(unsafe.Pointer(&out[0]))
	ms := C.int64_t(-1)
	if timeout >= 0 {
		ms = C.int64_t(timeout.Milliseconds())
	}
	err := call(func() uint32 { return C.fp_get(cl.c, &cids[0], C.size_t(len(ids)), ms, &out[0]) })
	if err != nil {
		return nil, err
	}
	bufs := make([]*Buffer, len(ids))
	for i, p := range out {
		if p != nil {
			bufs[i] = &Buffer{b: p}
		}
	}
	return bufs, nil
}

// Contains says whether the object is sealed in the store.
func (cl *Client) Contains(id ObjectID) (bool, error) {
	cid := id.c()
	var found C.bool
	err := call(func() uint32 { return C.fp_contains(cl.c, &cid, &found) })
	return bool(found), err
}

// Delete deletes objects (each now, or when its last reference goes).
func (cl *Client) Delete(ids ...ObjectID) error {
	if len(ids) == 0 {
		return nil
	}
	cids := make([]C.fp_object_id, len(ids))
	for i, id := range ids {
		cids[i] = id.c()
	}
	return call(func() uint32 { return C.fp_delete(cl.c, &cids[0], C.size_t(len(ids)), nil) })
}

// Stats are the store's main figures.
type Stats struct {
	Capacity, Used, Objects, SealedObjects, ReferencedObjects, Clients uint64
}

// Stats asks the store for its figures.
func (cl *Client) Stats() (Stats, error) {
	var s C.fp_stats
	err := call(func() uint32 { return C.fp_get_stats(cl.c, &s) })
	return Stats{
		Capacity: uint64(s.capacity), Used: uint64(s.used), Objects: uint64(s.objects),
		SealedObjects: uint64(s.sealed_objects), ReferencedObjects: uint64(s.referenced_objects),
		Clients: uint64(s.clients),
	}, err
}

// NDArray is a numpy array Python stored (a top-level array of a plain
// dtype): its dtype and shape, and its data as the store's bytes.
type NDArray struct {
	Typestr      string // numpy's typestr, e.g. "<f8"
	ItemSize     int
	Shape        []uint64
	FortranOrder bool
	Data         []byte // the store's memory, valid until the buffer's Release
}

// NDArray reads the buffer as a numpy array Python stored.
func (b *Buffer) NDArray() (*NDArray, error) {
	var a C.fp_ndarray
	if err := call(func() uint32 { return C.fp_ndarray_info(b.b, &a) }); err != nil {
		return nil, err
	}
	out := &NDArray{
		Typestr:      C.GoString(&a.typestr[0]),
		ItemSize:     int(a.itemsize),
		FortranOrder: bool(a.fortran_order),
	}
	for i := 0; i < int(a.ndim); i++ {
		out.Shape = append(out.Shape, uint64(a.shape[i]))
	}
	if a.size > 0 {
		out.Data = unsafe.Slice((*byte)(unsafe.Pointer(a.data)), int(a.size))
	}
	return out, nil
}
