//! Giving freed memory back to the operating system.
//!
//! The store's tables free their memory as objects go ([`crate::dense`]),
//! but glibc's allocator keeps freed memory for reuse unless it lies at the
//! top of its heap: after a burst of deletes a store would keep what its
//! tables once held. Once the tables have freed enough (16 MiB), they ask
//! the allocator to return the free pages of its heaps (`malloc_trim`).
//! Elsewhere (musl, other systems) this does nothing.

/// Asks the allocator to return its free pages to the operating system.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub(crate) fn give_back() {
    extern "C" {
        fn malloc_trim(pad: usize) -> std::ffi::c_int;
    }
    // Safety: malloc_trim only releases pages of free chunks back to the
    // kernel under the allocator's own locks; it touches no memory in use
    // and takes no pointer from us.
    unsafe {
        malloc_trim(0);
    }
}

/// Asks the allocator to return its free pages to the operating system.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub(crate) fn give_back() {}
