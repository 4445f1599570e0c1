//! Guest-side helpers shared by the service plugins.
