//! Environment pins (`gitplane rollback`) and preview environments in the state.
