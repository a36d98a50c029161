//! The server side of a scan: a query's batches, produced one ahead of the
//! send, and sent as gathered buffers.
//!
//! A producer thread reads the Arrow C stream (DuckDB's result) while the
//! connection's thread sends the batch before: DuckDB's execution and the
//! send overlap. The queue between them holds one batch, so at most three
//! batches are alive at once (one being produced, one waiting, one being
//! sent). A materialized scan reads the whole result before its first send
//! instead (to time the transport alone).

use std::collections::VecDeque;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;
use std::thread::JoinHandle;

use arrow_array::ffi_stream::ArrowArrayStreamReader;
use arrow_array::{RecordBatch, RecordBatchReader};
use arrow_schema::{ArrowError, SchemaRef};

use crate::error::{Error, Result};
use crate::{frame, io, layout};

type Produced = std::result::Result<RecordBatch, ArrowError>;

/// What one [`BatchSource::send`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sent {
    /// BATCH frames sent.
    pub batches: u64,
    /// Column bytes sent (frame heads and descriptors not counted).
    pub bytes: u64,
    /// False once the result's end was reached.
    pub more: bool,
}

/// One query's batches, read ahead of the send.
#[derive(Debug)]
pub struct BatchSource {
    schema: SchemaRef,
    ready: VecDeque<Produced>,
    queue: Option<Receiver<Produced>>,
    producer: Option<JoinHandle<ArrowArrayStreamReader>>,
    reader: Option<ArrowArrayStreamReader>,
    stop: Arc<AtomicBool>,
    ended: bool,
}

impl BatchSource {
    /// Starts reading `reader`: in a producer thread, or (`materialize`)
    /// to its end right here.
    pub fn new(mut reader: ArrowArrayStreamReader, materialize: bool) -> Result<BatchSource> {
        let schema = reader.schema();
        let stop = Arc::new(AtomicBool::new(false));
        let mut source = BatchSource {
            schema,
            ready: VecDeque::new(),
            queue: None,
            producer: None,
            reader: None,
            stop: stop.clone(),
            ended: false,
        };
        if materialize {
            for item in reader.by_ref() {
                let failed = item.is_err();
                source.ready.push_back(item);
                if failed {
                    break;
                }
            }
            source.reader = Some(reader);
            return Ok(source);
        }
        let (tx, rx) = sync_channel::<Produced>(1);
        let producer = std::thread::Builder::new()
            .name("scan producer".into())
            .spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let Some(item) = reader.next() else { break };
                    let failed = item.is_err();
                    if tx.send(item).is_err() || failed {
                        break;
                    }
                }
                reader
            })
            .map_err(Error::Io)?;
        source.queue = Some(rx);
        source.producer = Some(producer);
        Ok(source)
    }

    /// The result's schema.
    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// The next batch; `None` at the end. A failed query is [`Error::Query`].
    pub fn next_batch(&mut self) -> Result<Option<RecordBatch>> {
        if self.ended {
            return Ok(None);
        }
        let item = match self.ready.pop_front() {
            Some(item) => Some(item),
            None => self.queue.as_ref().and_then(|q| q.recv().ok()),
        };
        match item {
            Some(Ok(batch)) => Ok(Some(batch)),
            Some(Err(e)) => {
                self.ended = true;
                Err(Error::Query(query_message(e)))
            }
            None => {
                self.ended = true;
                Ok(None)
            }
        }
    }

    /// Sends up to `max_batches` BATCH frames of scan `scan` on `fd`,
    /// stopping early once `budget` bytes (if given) went out.
    pub fn send(
        &mut self,
        fd: BorrowedFd<'_>,
        scan: u64,
        max_batches: u64,
        budget: Option<u64>,
    ) -> Result<Sent> {
        let mut sent = Sent {
            batches: 0,
            bytes: 0,
            more: true,
        };
        while sent.batches < max_batches && budget.is_none_or(|b| sent.bytes < b) {
            let Some(batch) = self.next_batch()? else {
                sent.more = false;
                break;
            };
            sent.bytes += send_batch(fd, scan, &batch)?;
            sent.batches += 1;
        }
        Ok(sent)
    }

    /// Stops the producer and gives back the stream, for the caller to
    /// release where that is safe (DuckDB's stream under the GIL).
    pub fn close(&mut self) -> Option<ArrowArrayStreamReader> {
        self.stop.store(true, Ordering::Relaxed);
        self.ended = true;
        self.ready.clear();
        // Dropping the queue ends a producer waiting to hand a batch over.
        drop(self.queue.take());
        if let Some(p) = self.producer.take() {
            match p.join() {
                Ok(reader) => self.reader = Some(reader),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        self.reader.take()
    }
}

impl Drop for BatchSource {
    fn drop(&mut self) {
        drop(self.close());
    }
}

/// Sends one BATCH frame (head, descriptor, every buffer) in one gather
/// send; the column bytes it carried.
pub fn send_batch(fd: BorrowedFd<'_>, scan: u64, batch: &RecordBatch) -> Result<u64> {
    let (desc, bufs) = layout::flatten(batch);
    let body: u64 = bufs.iter().map(|b| b.len() as u64).sum();
    let head = frame::batch(scan, batch.num_rows(), &desc, body);
    let mut parts: Vec<&[u8]> = Vec::with_capacity(1 + bufs.len());
    parts.push(&head);
    parts.extend(bufs.iter().map(|b| b.as_slice()));
    io::send_all(fd, &parts)?;
    Ok(body)
}

/// DuckDB's message without the Arrow C stream's wrapping.
fn query_message(e: ArrowError) -> String {
    match e {
        ArrowError::ExternalError(inner) => inner.to_string(),
        ArrowError::CDataInterface(m) | ArrowError::IoError(m, _) => m,
        other => other.to_string(),
    }
}
