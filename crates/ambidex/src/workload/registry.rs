//! Workloads by name: a [`Registry`] maps the name a configuration gives
//! (`run.workload`) to the factory that builds the workload, so the benchmark driver, the
//! node processes and the simulator run any registered workload, built-in or an
//! application's, the same way.
//!
//! The [`Workload`] trait is not object safe (an `async fn` and an associated type), so
//! a registry keeps, per workload, the harness's operations instantiated for its type
//! ([`Entry`]): the cost of a trait object is paid once per run, never per transaction.

use super::Workload;
use crate::bench::combine::{Combine, CombineError};
use crate::bench::driver::{Run, WorkloadVisitor};
use crate::bench::node::{Load, LoadedNode, Rejoin};
use crate::bench::{BenchError, BenchReport, NodeError};
use crate::config::Config;
use crate::sim::{SimError, SimReport, SimRun};
use ambidex_txn::Placement;
use std::collections::BTreeMap;
use std::sync::Arc;

/// What the harness needs to know of a workload before building it.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkloadInfo {
    /// The name configurations and the command line use (`run.workload`).
    pub name: &'static str,
    /// Other names it answers to (`objstore` for `object-store`).
    pub aliases: &'static [&'static str],
    /// One line on what it is (`ambidex bench --help` lists it).
    pub about: &'static str,
    /// Worker coroutines per thread when the configuration does not say.
    pub default_coroutines: usize,
    /// The scale when the configuration does not say (a few seconds of loading on a
    /// small machine).
    pub default_scale: f64,
    /// The scale the simulator uses (its runs are short and many).
    pub sim_scale: f64,
}

/// What a workload's factory is given.
#[derive(Clone, Debug)]
pub struct WorkloadArgs<'a> {
    /// The run's configuration (workload parameters in its `run` section).
    pub config: &'a Config,
    /// The cluster's placement.
    pub placement: Placement,
    /// The scale (`run.scale`, or the workload's default for the path).
    pub scale: f64,
    /// Built for the simulator (short runs: a workload may change its mix).
    pub simulated: bool,
}

/// Something that takes workload registrations: a [`Registry`], or anything else that
/// keeps them by type. A crate of workloads offers one function that registers them all
/// into any `Registrar`.
pub trait Registrar {
    /// Registers workload `W` under `info.name`, built by `make`. A later registration
    /// of the same name replaces the earlier one.
    fn add<W, F>(&mut self, info: WorkloadInfo, make: F)
    where
        W: Workload,
        F: Fn(&WorkloadArgs<'_>) -> Result<W, super::WorkloadError> + Send + Sync + 'static;
}

/// The harness's operations on one registered workload, instantiated for its type.
pub(crate) trait Entry: Send + Sync {
    fn info(&self) -> &WorkloadInfo;
    fn bench(&self, cfg: &Config, v: Run<'_>) -> Result<(), BenchError>;
    fn load(&self, cfg: &Config, v: Load<'_>) -> Result<LoadedNode, NodeError>;
    fn rejoin(&self, cfg: &Config, v: Rejoin<'_>) -> Result<LoadedNode, NodeError>;
    fn combine(&self, cfg: &Config, v: Combine<'_>) -> Result<BenchReport, CombineError>;
    fn sim(&self, cfg: &Config, v: SimRun<'_>) -> Result<SimReport, SimError>;
}

struct Typed<W, F> {
    info: WorkloadInfo,
    make: F,
    _w: std::marker::PhantomData<fn() -> W>,
}

impl<W, F> Typed<W, F>
where
    W: Workload,
    F: Fn(&WorkloadArgs<'_>) -> Result<W, super::WorkloadError> + Send + Sync + 'static,
{
    fn build(&self, cfg: &Config, simulated: bool) -> Result<(Arc<W>, Placement), BenchError> {
        cfg.validate()?;
        let placement = cfg.placement()?;
        let scale = match (cfg.run.scale, simulated) {
            (Some(s), _) => s,
            (None, false) => self.info.default_scale,
            (None, true) => self.info.sim_scale,
        };
        let args = WorkloadArgs {
            config: cfg,
            placement: placement.clone(),
            scale,
            simulated,
        };
        let wl = (self.make)(&args).map_err(|source| BenchError::Workload {
            what: "built",
            source,
        })?;
        Ok((Arc::new(wl), placement))
    }

    fn visit<R, E: From<BenchError>>(
        &self,
        cfg: &Config,
        simulated: bool,
        v: impl WorkloadVisitor<R, E>,
    ) -> Result<R, E> {
        let (wl, placement) = self.build(cfg, simulated)?;
        v.visit(wl, placement)
    }
}

impl<W, F> Entry for Typed<W, F>
where
    W: Workload,
    F: Fn(&WorkloadArgs<'_>) -> Result<W, super::WorkloadError> + Send + Sync + 'static,
{
    fn info(&self) -> &WorkloadInfo {
        &self.info
    }
    fn bench(&self, cfg: &Config, v: Run<'_>) -> Result<(), BenchError> {
        self.visit(cfg, false, v)
    }
    fn load(&self, cfg: &Config, v: Load<'_>) -> Result<LoadedNode, NodeError> {
        self.visit(cfg, false, v)
    }
    fn rejoin(&self, cfg: &Config, v: Rejoin<'_>) -> Result<LoadedNode, NodeError> {
        self.visit(cfg, false, v)
    }
    fn combine(&self, cfg: &Config, v: Combine<'_>) -> Result<BenchReport, CombineError> {
        self.visit(cfg, false, v)
    }
    fn sim(&self, cfg: &Config, v: SimRun<'_>) -> Result<SimReport, SimError> {
        self.visit(cfg, true, v)
    }
}

/// A workload name no registration has (nor as an alias).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown workload {name:?} (registered: {})", registered(known))]
pub struct UnknownWorkload {
    /// The name asked for.
    pub name: String,
    /// The names registered.
    pub known: Vec<&'static str>,
}

fn registered(known: &[&str]) -> String {
    if known.is_empty() {
        "none".into()
    } else {
        known.join(", ")
    }
}

/// Workloads by name.
#[derive(Clone, Default)]
pub struct Registry {
    entries: BTreeMap<&'static str, Arc<dyn Entry>>,
}

impl Registrar for Registry {
    fn add<W, F>(&mut self, info: WorkloadInfo, make: F)
    where
        W: Workload,
        F: Fn(&WorkloadArgs<'_>) -> Result<W, super::WorkloadError> + Send + Sync + 'static,
    {
        let name = info.name;
        self.entries.insert(
            name,
            Arc::new(Typed {
                info,
                make,
                _w: std::marker::PhantomData,
            }),
        );
    }
}

impl Registry {
    /// A registry without workloads.
    pub fn new() -> Registry {
        Registry::default()
    }

    /// The registered workloads, by name.
    pub fn infos(&self) -> impl Iterator<Item = &WorkloadInfo> {
        self.entries.values().map(|e| e.info())
    }

    /// The workload registered as `name` (or under that alias).
    pub fn info(&self, name: &str) -> Option<&WorkloadInfo> {
        self.entry(name).ok().map(|e| e.info())
    }

    /// The entry of `cfg`'s workload, or an error naming the registered ones.
    pub(crate) fn entry(&self, name: &str) -> Result<&dyn Entry, UnknownWorkload> {
        let found = self.entries.get(name).or_else(|| {
            self.entries
                .values()
                .find(|e| e.info().aliases.contains(&name))
        });
        found.map(|e| &**e).ok_or_else(|| UnknownWorkload {
            name: name.to_string(),
            known: self.entries.keys().copied().collect(),
        })
    }

    /// `Ok` if a workload is registered as `name` (or under that alias), else an error
    /// naming the registered ones.
    pub fn entry_exists(&self, name: &str) -> Result<(), UnknownWorkload> {
        self.entry(name).map(|_| ())
    }

    /// `cfg` with its workload's defaults filled in: the workload's canonical name,
    /// `run.coroutines` and `run.scale` (for a benchmark run; the simulator has its own
    /// defaults). An error if no workload is registered under its name.
    pub fn resolve(&self, cfg: &Config) -> Result<Config, UnknownWorkload> {
        let info = self.entry(&cfg.run.workload)?.info();
        let mut c = cfg.clone();
        c.run.workload = info.name.to_string();
        c.run.coroutines = Some(cfg.run.coroutines.unwrap_or(info.default_coroutines));
        c.run.scale = Some(cfg.run.scale.unwrap_or(info.default_scale));
        Ok(c)
    }

    /// Worker coroutines per thread for `cfg` (`run.coroutines`, else its workload's
    /// default).
    pub fn coroutines(&self, cfg: &Config) -> Result<usize, UnknownWorkload> {
        Ok(self.resolve(cfg)?.coroutines())
    }

    /// The scale of `cfg`'s workload (`run.scale`, else its default).
    pub fn scale(&self, cfg: &Config) -> Result<f64, UnknownWorkload> {
        Ok(self.resolve(cfg)?.scale())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_workload_is_named_with_the_registered_ones() {
        let cfg = Config::default();
        let e = Registry::new().resolve(&cfg).unwrap_err();
        assert_eq!(e.name, "smallbank");
        assert_eq!(
            e.to_string(),
            "unknown workload \"smallbank\" (registered: none)"
        );
    }
}
