//! Detect-only drift in the state: the findings of a `drift: detect` run, recorded and read back.
