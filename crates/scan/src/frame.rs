//! The scan protocol's frames, as `python/ferroplasma/scan/wire.py`
//! describes them: a 16-byte head (kind, 3 reserved bytes, the length of the
//! JSON fields as a little-endian u32, the length of the body as a u64),
//! then the JSON fields, then the body.

use serde_json::{json, Map, Value};

use crate::error::{Error, Result};

/// Bytes in a frame's head.
pub const HEAD_LEN: usize = 16;
/// The most bytes of JSON fields a frame may carry.
pub const MAX_FIELDS: u32 = 1 << 20;

/// Client to server: ask for up to `batches` batches or `bytes` bytes.
pub const ITERATE: u8 = 3;
/// Client to server: end a scan.
pub const FINALIZE: u8 = 4;
/// Server to client: one batch, its buffers back to back in the body.
pub const BATCH: u8 = 18;
/// Server to client: one batch as one Arrow IPC message (the baseline).
pub const BATCH_IPC: u8 = 19;
/// Server to client: one batch already in the client's store.
pub const IDS: u8 = 20;
/// Server to client: the end of one ITERATE's answer.
pub const DONE: u8 = 21;
/// Server to client: the scan was ended.
pub const FINALIZED: u8 = 22;
/// Server to client: a request failed.
pub const ERROR: u8 = 31;

const KNOWN: [u8; 14] = [1, 2, 3, 4, 5, 16, 17, 18, 19, 20, 21, 22, 23, 31];

/// A frame's head, parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    pub kind: u8,
    pub fields_len: u32,
    pub body_len: u64,
}

impl Head {
    /// Reads a head; an unknown kind or oversized fields are protocol errors.
    pub fn parse(raw: &[u8; HEAD_LEN]) -> Result<Head> {
        let kind = raw[0];
        let fields_len = u32::from_le_bytes([raw[4], raw[5], raw[6], raw[7]]);
        let mut body = [0u8; 8];
        body.copy_from_slice(&raw[8..16]);
        let body_len = u64::from_le_bytes(body);
        if !KNOWN.contains(&kind) {
            return Err(Error::Protocol(format!("unknown scan frame kind {kind}")));
        }
        if fields_len > MAX_FIELDS {
            return Err(Error::Protocol(format!(
                "scan frame fields of {fields_len} bytes (limit {MAX_FIELDS})"
            )));
        }
        Ok(Head {
            kind,
            fields_len,
            body_len,
        })
    }
}

/// A frame's head and JSON fields, ready to send (the body follows).
pub fn encode(kind: u8, fields: &Value, body_len: u64) -> Vec<u8> {
    let raw = serde_json::to_vec(fields).expect("JSON values always serialize");
    let mut out = Vec::with_capacity(HEAD_LEN + raw.len());
    out.push(kind);
    out.extend_from_slice(&[0, 0, 0]);
    out.extend_from_slice(&(raw.len() as u32).to_le_bytes());
    out.extend_from_slice(&body_len.to_le_bytes());
    out.extend_from_slice(&raw);
    out
}

/// A BATCH frame's head and fields.
pub fn batch(scan: u64, rows: usize, desc: &[i64], body_len: u64) -> Vec<u8> {
    encode(
        BATCH,
        &json!({"scan": scan, "rows": rows, "desc": desc}),
        body_len,
    )
}

/// An ITERATE request.
pub fn iterate(scan: u64, batches: u64, bytes: u64) -> Vec<u8> {
    encode(
        ITERATE,
        &json!({"scan": scan, "batches": batches, "bytes": bytes}),
        0,
    )
}

/// A FINALIZE request.
pub fn finalize(scan: u64) -> Vec<u8> {
    encode(FINALIZE, &json!({ "scan": scan }), 0)
}

/// A frame's JSON fields: an object, or a protocol error.
pub fn parse_fields(raw: &[u8]) -> Result<Map<String, Value>> {
    if raw.is_empty() {
        return Ok(Map::new());
    }
    match serde_json::from_slice(raw) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(Error::Protocol(
            "scan frame fields are not a JSON object".into(),
        )),
        Err(e) => Err(Error::Protocol(format!(
            "scan frame fields are not JSON: {e}"
        ))),
    }
}

/// Field `name` as a non-negative integer.
pub fn uint(fields: &Map<String, Value>, name: &str) -> Result<u64> {
    fields
        .get(name)
        .and_then(Value::as_u64)
        .ok_or_else(|| Error::Protocol(format!("a frame's {name:?} is not a whole number")))
}

/// A BATCH frame's descriptor.
pub fn desc(fields: &Map<String, Value>) -> Result<Vec<i64>> {
    let bad = || Error::Protocol("a BATCH frame's \"desc\" is not a list of integers".into());
    let list = fields
        .get("desc")
        .and_then(Value::as_array)
        .ok_or_else(bad)?;
    list.iter().map(|v| v.as_i64().ok_or_else(bad)).collect()
}

/// An ERROR frame as an [`Error::Remote`].
pub fn remote_error(fields: &Map<String, Value>) -> Error {
    let text = |k: &str| fields.get(k).and_then(Value::as_str).map(str::to_owned);
    Error::Remote {
        code: text("code").unwrap_or_else(|| "scan".into()),
        message: text("message").unwrap_or_else(|| "the scan server reported an error".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_reads_back_as_it_was_written() {
        let raw = batch(7, 3, &[3, 0, 0, 2, 0, 0, -1, 24], 24);
        let mut head = [0u8; HEAD_LEN];
        head.copy_from_slice(&raw[..HEAD_LEN]);
        let h = Head::parse(&head).unwrap();
        assert_eq!((h.kind, h.body_len), (BATCH, 24));
        let f = parse_fields(&raw[HEAD_LEN..]).unwrap();
        assert_eq!(h.fields_len as usize, raw.len() - HEAD_LEN);
        assert_eq!(uint(&f, "rows").unwrap(), 3);
        assert_eq!(desc(&f).unwrap(), vec![3, 0, 0, 2, 0, 0, -1, 24]);
    }

    #[test]
    fn unknown_kinds_and_huge_fields_are_refused() {
        let mut head = [0u8; HEAD_LEN];
        head[0] = 99;
        assert!(matches!(Head::parse(&head), Err(Error::Protocol(_))));
        head[0] = BATCH;
        head[4..8].copy_from_slice(&(MAX_FIELDS + 1).to_le_bytes());
        assert!(matches!(Head::parse(&head), Err(Error::Protocol(_))));
        assert!(parse_fields(b"[1]").is_err());
        assert!(parse_fields(b"{\"desc\": [1, \"x\"]}")
            .and_then(|f| desc(&f))
            .is_err());
    }
}
