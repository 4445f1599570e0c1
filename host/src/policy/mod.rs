//! Rego policy engine, decisions and the audit log (see DESIGN.md §6).
