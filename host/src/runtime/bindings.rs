//! Host bindings generated from the WIT contract in `wit/`.

wasmtime::component::bindgen!({
    world: "plugin",
    path: "../wit",
});
