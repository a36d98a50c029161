//! Status codes, the error message of the last failed call (per thread),
//! and [`guard`], which every exported function runs its body in.

use ferroplasma_client::ClientError;
use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// What a call did: `FP_OK`, or why it failed (`fp_last_error()` says more).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum fp_status {
    /// Done.
    FP_OK = 0,
    /// No store at the socket path, or it refused the connection.
    FP_STORE_UNAVAILABLE = 1,
    /// An object with this id exists already.
    FP_OBJECT_EXISTS = 2,
    /// No such object.
    FP_OBJECT_NOT_FOUND = 3,
    /// No room, even after evicting everything unreferenced; also an object
    /// larger than the whole store (the message says which, as Plasma's
    /// store-full error covered both).
    FP_STORE_FULL = 4,
    /// The object is not in a state that allows this (e.g. sealed twice).
    FP_INVALID_STATE = 5,
    /// A request larger than one message of the protocol may carry (the
    /// calls split what they send, so this means a store that allows less
    /// than this library expects).
    FP_TOO_LARGE = 6,
    /// A bad argument: a NULL pointer, a bad id, sizes that do not match.
    FP_INVALID_ARGUMENT = 7,
    /// The store sent something this library does not understand.
    FP_PROTOCOL = 8,
    /// This client holds no reference to the object.
    FP_NOT_HELD = 9,
    /// The client was made before a fork(): connect again in the child.
    FP_FORKED = 10,
    /// The connection to the store broke.
    FP_DISCONNECTED = 11,
    /// The object was lost with the cluster member that held it.
    FP_OBJECT_LOST = 12,
    /// Not enough of the store's cluster is reachable.
    FP_CLUSTER_UNAVAILABLE = 13,
    /// A signal interrupted the call.
    FP_INTERRUPTED = 14,
    /// Nothing arrived in time (subscriptions).
    FP_TIMEOUT = 15,
    /// A bug in this library (a Rust panic, caught at the boundary).
    FP_PANIC = 16,
    /// Not allowed: the store is run by a user this client does not trust
    /// (see FERROPLASMA_TRUST_UID), or this client's user may only read it.
    FP_PERMISSION_DENIED = 17,
    /// This connection already has as many gets waiting (or objects
    /// awaited) as the store allows: retry when some finish.
    FP_TOO_MANY_WAITING = 18,
    /// The store serves its maximum of clients (--max-clients) and refused
    /// this connection: retry when some have disconnected.
    FP_STORE_BUSY = 19,
}

/// The errors of this library (one enum per crate).
#[derive(Debug, thiserror::Error)]
pub enum CapiError {
    /// From the Rust client.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// A bad argument.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Nothing arrived in time.
    #[error("timed out: {0}")]
    Timeout(String),
}

impl CapiError {
    /// The status code of this error.
    pub fn status(&self) -> fp_status {
        use fp_status::*;
        match self {
            CapiError::InvalidArgument(_) => FP_INVALID_ARGUMENT,
            CapiError::Timeout(_) => FP_TIMEOUT,
            CapiError::Client(e) => match e {
                ClientError::StoreUnavailable { .. } => FP_STORE_UNAVAILABLE,
                ClientError::ObjectExists { .. } => FP_OBJECT_EXISTS,
                ClientError::ObjectNotFound { .. } => FP_OBJECT_NOT_FOUND,
                ClientError::StoreFull(_) => FP_STORE_FULL,
                ClientError::InvalidState(_) => FP_INVALID_STATE,
                ClientError::TooLarge(_) => FP_TOO_LARGE,
                ClientError::TooManyWaiting(_) => FP_TOO_MANY_WAITING,
                ClientError::StoreBusy(_) => FP_STORE_BUSY,
                ClientError::InvalidRequest(_) => FP_INVALID_ARGUMENT,
                ClientError::VersionMismatch(_) | ClientError::Protocol(_) => FP_PROTOCOL,
                ClientError::NotHeld(_) => FP_NOT_HELD,
                ClientError::Forked { .. } => FP_FORKED,
                ClientError::Disconnected(_) => FP_DISCONNECTED,
                ClientError::ObjectLost { .. } => FP_OBJECT_LOST,
                ClientError::ClusterUnavailable(_) => FP_CLUSTER_UNAVAILABLE,
                ClientError::PermissionDenied(_) => FP_PERMISSION_DENIED,
                ClientError::Interrupted => FP_INTERRUPTED,
            },
        }
    }
}

/// Shorthand for a bad argument.
pub(crate) fn invalid(what: impl Into<String>) -> CapiError {
    CapiError::InvalidArgument(what.into())
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn remember(message: String) {
    let c = CString::new(message.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

/// The value of `r`, or `default` with the error remembered for
/// `fp_last_error()` (for calls that return a value, not a status).
pub(crate) fn noted<T>(r: Result<T, CapiError>, default: T) -> T {
    r.unwrap_or_else(|e| {
        remember(e.to_string());
        default
    })
}

/// Runs `f`, turning its error or panic into a status code and remembering
/// the message for `fp_last_error()`.
pub(crate) fn guard(f: impl FnOnce() -> Result<(), CapiError>) -> fp_status {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => fp_status::FP_OK,
        Ok(Err(e)) => {
            remember(e.to_string());
            e.status()
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown".into());
            remember(format!("bug in libferroplasma (panic: {what})"));
            fp_status::FP_PANIC
        }
    }
}

/// The message of the last call on this thread that did not return
/// `FP_OK` ("" if none). Valid until the next failing call on this thread;
/// owned by the library (do not free it).
#[no_mangle]
pub extern "C" fn fp_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// A static, human-readable name of a status code ("FP_OK", ...;
/// "FP_UNKNOWN" for a number that is no status).
#[no_mangle]
pub extern "C" fn fp_status_name(status: i32) -> *const c_char {
    use fp_status::*;
    const ALL: [fp_status; 20] = [
        FP_OK,
        FP_STORE_UNAVAILABLE,
        FP_OBJECT_EXISTS,
        FP_OBJECT_NOT_FOUND,
        FP_STORE_FULL,
        FP_INVALID_STATE,
        FP_TOO_LARGE,
        FP_INVALID_ARGUMENT,
        FP_PROTOCOL,
        FP_NOT_HELD,
        FP_FORKED,
        FP_DISCONNECTED,
        FP_OBJECT_LOST,
        FP_CLUSTER_UNAVAILABLE,
        FP_INTERRUPTED,
        FP_TIMEOUT,
        FP_PANIC,
        FP_PERMISSION_DENIED,
        FP_TOO_MANY_WAITING,
        FP_STORE_BUSY,
    ];
    let Some(&known) = ALL.iter().find(|s| **s as i32 == status) else {
        return c"FP_UNKNOWN".as_ptr();
    };
    let name: &'static std::ffi::CStr = match known {
        FP_OK => c"FP_OK",
        FP_STORE_UNAVAILABLE => c"FP_STORE_UNAVAILABLE",
        FP_OBJECT_EXISTS => c"FP_OBJECT_EXISTS",
        FP_OBJECT_NOT_FOUND => c"FP_OBJECT_NOT_FOUND",
        FP_STORE_FULL => c"FP_STORE_FULL",
        FP_INVALID_STATE => c"FP_INVALID_STATE",
        FP_TOO_LARGE => c"FP_TOO_LARGE",
        FP_INVALID_ARGUMENT => c"FP_INVALID_ARGUMENT",
        FP_PROTOCOL => c"FP_PROTOCOL",
        FP_NOT_HELD => c"FP_NOT_HELD",
        FP_FORKED => c"FP_FORKED",
        FP_DISCONNECTED => c"FP_DISCONNECTED",
        FP_OBJECT_LOST => c"FP_OBJECT_LOST",
        FP_CLUSTER_UNAVAILABLE => c"FP_CLUSTER_UNAVAILABLE",
        FP_INTERRUPTED => c"FP_INTERRUPTED",
        FP_TIMEOUT => c"FP_TIMEOUT",
        FP_PANIC => c"FP_PANIC",
        FP_PERMISSION_DENIED => c"FP_PERMISSION_DENIED",
        FP_TOO_MANY_WAITING => c"FP_TOO_MANY_WAITING",
        FP_STORE_BUSY => c"FP_STORE_BUSY",
    };
    name.as_ptr()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_and_panics_become_codes_with_a_message() {
        assert_eq!(guard(|| Ok(())), fp_status::FP_OK);
        assert_eq!(
            guard(|| Err(invalid("x is NULL"))),
            fp_status::FP_INVALID_ARGUMENT
        );
        // Safety: fp_last_error returns a valid NUL-terminated string.
        let msg = unsafe { std::ffi::CStr::from_ptr(fp_last_error()) };
        assert_eq!(msg.to_str().unwrap(), "invalid argument: x is NULL");
        assert_eq!(guard(|| panic!("boom")), fp_status::FP_PANIC);
        // Safety: as above.
        let msg = unsafe { std::ffi::CStr::from_ptr(fp_last_error()) };
        assert!(msg.to_str().unwrap().contains("boom"));
    }
}
