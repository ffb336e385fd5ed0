//! Handing freed memory back to the kernel around full syncs.
//!
//! glibc's malloc keeps what is freed for reuse and returns to the kernel only the free top of
//! a heap. Between the initial lists (every object decoded from JSON, then dropped once the
//! index holds what the datapath reads) and a full sync (a planned ruleset and its batches,
//! dropped once applied), the agent frees tens of megabytes interleaved with what it keeps, and
//! those pages stay resident: at 10,000 Services the first sync's peak resident set varied by
//! up to 8 MB between runs of the same build with the same live heap, by how the freed chunks
//! happened to fit what was allocated next. `malloc_trim(0)` returns every free page of every
//! arena (`madvise(MADV_DONTNEED)`), so what is resident after it is what is live. It walks the
//! arenas' free lists once: about a millisecond at these sizes, done only around full syncs.

/// Returns the allocator's free pages to the kernel (glibc; elsewhere nothing to do).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn release_free_memory() {
    // SAFETY: malloc_trim takes an integer and only rearranges the allocator's own free lists
    // under its arena locks; it is safe to call from any thread at any time.
    #[allow(unsafe_code)]
    unsafe {
        nix::libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn release_free_memory() {}
