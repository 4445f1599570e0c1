//! The wasmtime sandbox that runs service plugins (see DESIGN.md §4).
