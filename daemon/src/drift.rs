//! Detect-only drift runs: read each resource through its driver (or compare with what was
//! recorded), record what differs, change nothing.
