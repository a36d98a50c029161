//! The one place where client and scan errors become Python exceptions
//! (classes defined in `ferroplasma/errors.py`).

use ferroplasma_client::ClientError;
use ferroplasma_scan::Error as ScanWireError;
use pyo3::prelude::*;

pyo3::import_exception!(ferroplasma.errors, ObjectExists);
pyo3::import_exception!(ferroplasma.errors, ObjectNotFound);
pyo3::import_exception!(ferroplasma.errors, StoreFull);
pyo3::import_exception!(ferroplasma.errors, StoreUnavailable);
pyo3::import_exception!(ferroplasma.errors, InvalidObjectState);
pyo3::import_exception!(ferroplasma.errors, ObjectTooLarge);
pyo3::import_exception!(ferroplasma.errors, InvalidRequest);
pyo3::import_exception!(ferroplasma.errors, ProtocolError);
pyo3::import_exception!(ferroplasma.errors, ObjectNotHeld);
pyo3::import_exception!(ferroplasma.errors, ForkedClient);
pyo3::import_exception!(ferroplasma.errors, Disconnected);
pyo3::import_exception!(ferroplasma.errors, ObjectLost);
pyo3::import_exception!(ferroplasma.errors, ClusterUnavailable);
pyo3::import_exception!(ferroplasma.errors, PermissionDenied);
pyo3::import_exception!(ferroplasma.errors, TooManyWaiting);
pyo3::import_exception!(ferroplasma.errors, StoreBusy);
pyo3::import_exception!(ferroplasma.errors, SerializationError);
pyo3::import_exception!(ferroplasma.errors, ScanError);
pyo3::import_exception!(ferroplasma.errors, QueryError);
pyo3::import_exception!(ferroplasma.errors, DatasetNotFound);
pyo3::import_exception!(ferroplasma.errors, AccessDenied);
pyo3::import_exception!(ferroplasma.errors, ScanServerUnavailable);

/// An object that cannot be laid out or read back (`SerializationError`).
pub fn serialization_error(msg: impl Into<String>) -> PyErr {
    SerializationError::new_err(msg.into())
}

/// Maps a client error onto the Python exception tree.
pub fn to_py(e: ClientError) -> PyErr {
    let msg = e.to_string();
    match e {
        ClientError::StoreUnavailable { .. } => StoreUnavailable::new_err(msg),
        ClientError::ObjectExists { .. } => ObjectExists::new_err(msg),
        ClientError::ObjectNotFound { .. } => ObjectNotFound::new_err(msg),
        ClientError::StoreFull(_) => StoreFull::new_err(msg),
        ClientError::InvalidState(_) => InvalidObjectState::new_err(msg),
        ClientError::TooLarge(_) => ObjectTooLarge::new_err(msg),
        ClientError::TooManyWaiting(_) => TooManyWaiting::new_err(msg),
        ClientError::StoreBusy(_) => StoreBusy::new_err(msg),
        ClientError::InvalidRequest(_) => InvalidRequest::new_err(msg),
        ClientError::VersionMismatch(_) | ClientError::Protocol(_) => ProtocolError::new_err(msg),
        ClientError::NotHeld(_) => ObjectNotHeld::new_err(msg),
        ClientError::Forked { .. } => ForkedClient::new_err(msg),
        ClientError::Disconnected(_) => Disconnected::new_err(msg),
        ClientError::ObjectLost { .. } => ObjectLost::new_err(msg),
        ClientError::ClusterUnavailable(_) => ClusterUnavailable::new_err(msg),
        ClientError::PermissionDenied(_) => PermissionDenied::new_err(msg),
        // A signal handler raised (Ctrl-C: KeyboardInterrupt): that error.
        ClientError::Interrupted => Python::attach(PyErr::take)
            .unwrap_or_else(|| pyo3::exceptions::PyKeyboardInterrupt::new_err(msg)),
    }
}

/// Which side of a scan saw a scan error: a broken connection is the
/// server's loss of a client (`ConnectionError`, which ends only that
/// connection) or the client's loss of its server (`ScanServerUnavailable`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScanSide {
    Server,
    Client,
}

/// Maps a scan data-path error onto the Python exception tree; an ERROR
/// frame's code picks the class as `ferroplasma.scan.client` does.
pub fn scan_to_py(e: ScanWireError, side: ScanSide) -> PyErr {
    let msg = e.to_string();
    match e {
        ScanWireError::Io(io) if side == ScanSide::Server => io.into(),
        ScanWireError::Io(_) => {
            ScanServerUnavailable::new_err(format!("the scan server hung up: {msg}"))
        }
        ScanWireError::Protocol(_) => ProtocolError::new_err(msg),
        ScanWireError::Query(_) => QueryError::new_err(msg),
        ScanWireError::Layout(_) => SerializationError::new_err(msg),
        ScanWireError::Closed => ScanError::new_err(msg),
        ScanWireError::Store(inner) => match inner.downcast::<ClientError>() {
            Ok(client) => to_py(*client),
            Err(other) => ScanError::new_err(other.to_string()),
        },
        ScanWireError::Remote { code, .. } => match code.as_str() {
            "auth" | "access" => AccessDenied::new_err(msg),
            "dataset" => DatasetNotFound::new_err(msg),
            "query" => QueryError::new_err(msg),
            "protocol" => ProtocolError::new_err(msg),
            "busy" => ScanServerUnavailable::new_err(msg),
            _ => ScanError::new_err(msg),
        },
    }
}

/// `Result` adapter: `client_call().map_err(to_py)?`.
pub trait IntoPy<T> {
    /// Converts the error.
    fn py_err(self) -> PyResult<T>;
}

impl<T> IntoPy<T> for Result<T, ClientError> {
    fn py_err(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}
