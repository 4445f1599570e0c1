//! Host bindings generated from the WIT contracts in `wit/`: the current one and every earlier
//! one the host still serves (docs/architecture.md, The WIT contract and its versions).

/// `stateward:plugin@0.1.0`: no requests to the running service.
pub mod v0_1 {
    wasmtime::component::bindgen!({
        world: "plugin",
        path: "../wit/v0.1",
    });
}

/// `stateward:plugin@0.2.0`, the current contract.
pub mod v0_2 {
    wasmtime::component::bindgen!({
        world: "plugin",
        path: "../wit/v0.2",
    });
}
