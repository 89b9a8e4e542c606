//! Preview environments: one per matching branch, deployed from its head, removed when the
//! branch goes or its time runs out.
