//! What a commit would change, for review: every environment's plan against its state, grouped
//! by app, as Markdown (a pull-request comment), JSON or text.
