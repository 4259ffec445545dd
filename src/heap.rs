//! The process's heap settings: glibc's malloc keeps the memory a plan frees.
//!
//! A plan allocates about a megabyte of lists (events, buffers, the allocator model's bins)
//! and frees all of it; glibc then hands the top of its heap back to the system whenever more
//! than its trim threshold is free (by default twice the largest freed `mmap` chunk, about
//! 670 kB here), and the next plan faults those pages in again. A `fit` or a max-batch search
//! plans hundreds of times, so a process spends a large share of its time in page faults
//! (Llama-2-7B, `bench-plan --reps 200`: 55 203 faults and 0.276 ms for a plan's graph and
//! events, against 695 faults and 0.184 ms with the thresholds below; docs/speed.md). Both
//! thresholds at 32 MiB keep the freed pages in the process, as
//! `GLIBC_TUNABLES=glibc.malloc.trim_threshold=33554432:glibc.malloc.mmap_threshold=33554432`
//! would.

/// Sets glibc's trim and mmap thresholds (Linux with glibc; elsewhere nothing). Called first
/// thing in `main`, before any thread starts.
pub fn keep_freed_pages() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        const THRESHOLD: libc::c_int = 32 << 20;
        // SAFETY: `mallopt` only sets malloc's tuning parameters; it is called before any
        // other thread exists, and its failure (return 0) leaves the defaults in place.
        #[allow(unsafe_code)]
        unsafe {
            libc::mallopt(libc::M_TRIM_THRESHOLD, THRESHOLD);
            libc::mallopt(libc::M_MMAP_THRESHOLD, THRESHOLD);
        }
    }
}
