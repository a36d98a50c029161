package ferroplasma

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"
)

// Kinds of objects Python writes (docs/serialization.md).
const (
	headerSize     = 64 // ferroplasma's header, padded to 64 bytes
	kindArrowTable = 1
	kindArrowBatch = 2
)

// Table is Arrow data read from the store: its record batches' buffers are
// the store's memory. Release it when done (it holds the object).
type Table struct {
	Schema  *arrow.Schema
	Records []arrow.RecordBatch
	buf     *Buffer
}

// Release releases the batches and gives the object's reference back.
func (t *Table) Release() {
	for _, r := range t.Records {
		r.Release()
	}
	t.Records = nil
	if t.buf != nil {
		t.buf.Release()
		t.buf = nil
	}
}

// NumRows is the rows over all batches.
func (t *Table) NumRows() int64 {
	var n int64
	for _, r := range t.Records {
		n += r.NumRows()
	}
	return n
}

// Payload returns the Arrow IPC stream of a table or batch that Python (or
// PutTable) stored, as the store's bytes.
func payload(data []byte) ([]byte, error) {
	if len(data) < 32 || string(data[:4]) != "FPSO" || data[4] != 1 {
		return nil, errors.New("ferroplasma: not an object with ferroplasma's header (format 1)")
	}
	if k := data[5]; k != kindArrowTable && k != kindArrowBatch {
		return nil, fmt.Errorf("ferroplasma: object of kind %d is not Arrow IPC data", k)
	}
	off := binary.LittleEndian.Uint64(data[16:])
	n := binary.LittleEndian.Uint64(data[24:])
	if off > uint64(len(data)) || n > uint64(len(data))-off {
		return nil, errors.New("ferroplasma: corrupt object header")
	}
	return data[off : off+n], nil
}

// storeMessages reads IPC messages straight out of a byte slice: metadata
// and bodies are sub-slices, so the arrays built on them are not copies.
type storeMessages struct {
	data []byte
	pos  int
	msg  *ipc.Message
}

func (s *storeMessages) Retain()  {}
func (s *storeMessages) Release() {}

func (s *storeMessages) take(n int) ([]byte, error) {
	if n < 0 || n > len(s.data)-s.pos {
		return nil, io.ErrUnexpectedEOF
	}
	b := s.data[s.pos : s.pos+n : s.pos+n]
	s.pos += n
	return b, nil
}

func (s *storeMessages) Message() (*ipc.Message, error) {
	head, err := s.take(4)
	if err != nil {
		return nil, io.EOF
	}
	n := binary.LittleEndian.Uint32(head)
	if n == 0xFFFFFFFF {
		if head, err = s.take(4); err != nil {
			return nil, err
		}
		n = binary.LittleEndian.Uint32(head)
	}
	if n == 0 {
		return nil, io.EOF
	}
	meta, err := s.take(int(n))
	if err != nil {
		return nil, err
	}
	probe := ipc.NewMessage(memory.NewBufferBytes(meta), memory.NewBufferBytes(nil))
	bodyLen := probe.BodyLen()
	probe.Release()
	body, err := s.take(int(bodyLen))
	if err != nil {
		return nil, err
	}
	if s.msg != nil {
		s.msg.Release()
	}
	s.msg = ipc.NewMessage(memory.NewBufferBytes(meta), memory.NewBufferBytes(body))
	return s.msg, nil
}

// GetTable gets an Arrow table or record batch stored under id (by Python,
// C++ or PutTable), waiting up to timeout (negative: forever). Its column
// buffers are the store's memory: nothing is copied.
func (cl *Client) GetTable(id ObjectID, timeout time.Duration) (*Table, error) {
	bufs, err := cl.Get([]ObjectID{id}, timeout)
	if err != nil {
		return nil, err
	}
	if bufs[0] == nil {
		return nil, &Error{Status: StatusObjectNotFound, Message: "object " + id.Hex() + " is not available"}
	}
	t := &Table{buf: bufs[0]}
	p, err := payload(t.buf.Bytes())
	if err != nil {
		t.Release()
		return nil, err
	}
	rdr, err := ipc.NewReaderFromMessageReader(&storeMessages{data: p})
	if err != nil {
		t.Release()
		return nil, err
	}
	defer rdr.Release()
	t.Schema = rdr.Schema()
	for rdr.Next() {
		rec := rdr.RecordBatch()
		rec.Retain()
		t.Records = append(t.Records, rec)
	}
	if err := rdr.Err(); err != nil && !errors.Is(err, io.EOF) {
		t.Release()
		return nil, err
	}
	return t, nil
}

type counter struct{ n int }

func (c *counter) Write(p []byte) (int, error) { c.n += len(p); return len(p), nil }

type into struct {
	dst []byte
	at  int
}

func (w *into) Write(p []byte) (int, error) {
	if len(p) > len(w.dst)-w.at {
		return 0, io.ErrShortWrite
	}
	copy(w.dst[w.at:], p)
	w.at += len(p)
	return len(p), nil
}

func writeStream(w io.Writer, schema *arrow.Schema, records []arrow.RecordBatch) error {
	iw := ipc.NewWriter(w, ipc.WithSchema(schema))
	for _, r := range records {
		if err := iw.Write(r); err != nil {
			return err
		}
	}
	return iw.Close()
}

// PutTable stores record batches under id as Python's Arrow table object
// (an IPC stream behind ferroplasma's header), written once, straight into
// the store; Python's get returns it as a zero-copy pyarrow.Table.
func (cl *Client) PutTable(id ObjectID, schema *arrow.Schema, records []arrow.RecordBatch) error {
	var size counter
	if err := writeStream(&size, schema, records); err != nil {
		return err
	}
	m, err := cl.Create(id, uint64(headerSize+size.n), nil)
	if err != nil {
		return err
	}
	b := m.Bytes()
	clear(b[:headerSize])
	copy(b, "FPSO")
	b[4], b[5] = 1, kindArrowTable
	binary.LittleEndian.PutUint64(b[16:], headerSize)
	binary.LittleEndian.PutUint64(b[24:], uint64(size.n))
	if err := writeStream(&into{dst: b[headerSize:]}, schema, records); err != nil {
		_ = cl.Abort(m)
		return err
	}
	return cl.Seal(m)
}
