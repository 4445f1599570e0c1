//! What a component declares it will create per instantiation, read from its bytes before
//! anything is compiled or run: linear memories, tables and core instances.
//!
//! The store's limiter enforces the same limits while a call runs; this check only makes the
//! refusal come at load, before compilation, with a reason naming what is over.

use wasmparser::{Instance, Parser, Payload};

use super::sandbox::Limits;
use super::RuntimeError;

/// Counts summed over every core module and nested component in the binary. A module that is
/// instantiated more than once counts once here; the store's limiter counts every instance.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Declared {
    /// Linear memories the modules define (imported ones alias another module's).
    pub memories: usize,
    /// Tables the modules define.
    pub tables: usize,
    /// Core instances the components create by instantiating a module.
    pub instances: usize,
}

impl Declared {
    /// Reads the counts from a component's bytes. Bytes wasmparser cannot read are not a
    /// component.
    pub fn of(bytes: &[u8]) -> Result<Self, RuntimeError> {
        let mut out = Self::default();
        for payload in Parser::new(0).parse_all(bytes) {
            match payload.map_err(|e| RuntimeError::NotAComponent(e.to_string()))? {
                Payload::MemorySection(s) => out.memories += s.count() as usize,
                Payload::TableSection(s) => out.tables += s.count() as usize,
                Payload::InstanceSection(s) => {
                    for instance in s {
                        let instance = instance.map_err(|e| RuntimeError::NotAComponent(e.to_string()))?;
                        if matches!(instance, Instance::Instantiate { .. }) {
                            out.instances += 1;
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(out)
    }

    /// Refuses a component that declares more of anything than one call may create.
    pub fn check(&self, limits: &Limits) -> Result<(), RuntimeError> {
        for (what, declared, limit) in [
            ("linear memories", self.memories, limits.memories),
            ("tables", self.tables, limits.tables),
            ("core instances", self.instances, limits.instances),
        ] {
            if declared > limit {
                return Err(RuntimeError::TooManyResources { what, declared, limit });
            }
        }
        Ok(())
    }
}
