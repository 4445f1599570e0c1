//! Local control plane helper for tests.
