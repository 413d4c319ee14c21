//! `carma local serve`: the daemon of one machine.
//!
//! Every tick (default 1 s, CARMA's loop) it takes new submissions from the spool, samples the
//! GPUs, notices attempts that ended, asks carma-core what follows each ([`carma_core::decide_next`]),
//! and dispatches the heads of the recovery queue and then of the main queue where carma-core's
//! placement ([`carma_core::place_on_node`], with [`carma_core::placement::recovery_first`]) finds
//! GPUs. Everything it decides is journaled before it acts; see `recover.rs` for what a restart does.

mod attempts;
mod recover;
mod schedule;

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::PathBuf;
use std::process::Child;
use std::time::Duration;

use carma_core::{
    Ledger, Millis, OomPatterns, PlacementConfig, Policy, QueueOrder, RecoveryConfig,
};
use serde_json::json;

use crate::error::{LocalError, Result};
use crate::jobs::{JobState, JobTable};
use crate::journal::{AttemptUsage, Event, Journal};
use crate::layout::{StateDir, append_line, lock, lock_still_held, write_atomic};
use crate::spec::{now_ms, read_spool};
use crate::telemetry::{BackendChoice, GpuReading, JobOnGpus, Telemetry};

/// How the daemon runs.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// The state directory (created when missing).
    pub state_dir: PathBuf,
    /// The GPU backend.
    pub backend: BackendChoice,
    /// Policy of jobs that name none.
    pub policy: Policy,
    /// Placement thresholds (CARMA's by default).
    pub placement: PlacementConfig,
    /// Recovery settings.
    pub recovery: RecoveryConfig,
    /// Loop period (and telemetry sampling interval).
    pub interval: Duration,
    /// Samples per activity window (CARMA: 30).
    pub window: usize,
    /// Give each job `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` = its reservation (MPS must run).
    pub mps_memory_limit: bool,
    /// Return once at least one job has been taken and the spool and both queues are empty and
    /// nothing runs.
    pub exit_when_idle: bool,
    /// What marks a GPU out-of-memory crash in a job's output.
    pub oom_patterns: OomPatterns,
    /// Order of each queue by what jobs declare (`--expected-duration`), then arrival; the queue
    /// stays strict (its head blocks the rest).
    pub queue_order: QueueOrder,
}

impl ServeConfig {
    /// CARMA's settings with `backend` in `state_dir`.
    pub fn new(state_dir: impl Into<PathBuf>, backend: BackendChoice) -> Self {
        Self {
            state_dir: state_dir.into(),
            backend,
            policy: Policy::DEFAULT,
            placement: PlacementConfig::default(),
            recovery: RecoveryConfig::default(),
            interval: Duration::from_secs(1),
            window: carma_core::telemetry::DEFAULT_WINDOW,
            mps_memory_limit: false,
            exit_when_idle: false,
            oom_patterns: crate::classify::default_patterns(),
            queue_order: QueueOrder::Arrival,
        }
    }
}

/// Running totals of what telemetry saw of one running attempt.
#[derive(Debug, Clone, Default)]
struct UsageTotals {
    peak_mib: Option<u64>,
    sm_sum: f64,
    sm_samples: u32,
    energy_j: Option<f64>,
    samples: u32,
}

impl UsageTotals {
    fn finish(&self) -> AttemptUsage {
        AttemptUsage {
            peak_mib: self.peak_mib,
            sm_activity_mean: (self.sm_samples > 0)
                .then(|| self.sm_sum / f64::from(self.sm_samples)),
            energy_j: self.energy_j,
            samples: self.samples,
        }
    }
}

/// The daemon's state between ticks.
#[derive(Debug)]
pub(crate) struct Daemon {
    cfg: ServeConfig,
    dir: StateDir,
    journal: Journal,
    table: JobTable,
    ledger: Ledger,
    telemetry: Telemetry,
    /// Attempts this daemon spawned, by job id (reaped with `try_wait`).
    children: HashMap<String, Child>,
    /// Launchers whose job ended but which had not exited yet when seen (reaped later).
    exiting: Vec<Child>,
    usage: HashMap<String, UsageTotals>,
    last_energy: HashMap<String, f64>,
    /// Why the head of each queue waits (for `status`).
    waiting: BTreeMap<String, String>,
    rr_cursor: usize,
    gpus: Vec<GpuReading>,
    lock: File,
}

/// Serve `cfg.state_dir` until `shutdown` completes (or, with `exit_when_idle`, until idle).
///
/// Running jobs are left running when the daemon stops; the next `serve` re-adopts them.
pub async fn serve(
    cfg: ServeConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<()> {
    let mut daemon = Daemon::open(cfg)?;
    tokio::pin!(shutdown);
    let mut ticker = tokio::time::interval(daemon.cfg.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = &mut shutdown => {
                tracing::info!("stopping; running jobs keep running and are re-adopted by the next serve");
                return Ok(());
            }
            _ = ticker.tick() => {}
        }
        daemon.step().await?;
        if daemon.cfg.exit_when_idle && daemon.idle()? {
            tracing::info!("nothing queued or running: exiting (--exit-when-idle)");
            return Ok(());
        }
    }
}

impl Daemon {
    fn open(cfg: ServeConfig) -> Result<Self> {
        let dir = StateDir::create(&cfg.state_dir)?;
        let lock = lock(&dir)?;
        let journal = Journal::new(dir.journal());
        journal.repair()?;
        let table = JobTable::from_events(&journal.read()?);
        let telemetry = Telemetry::start(&cfg.backend, cfg.interval, cfg.window)?;
        tracing::info!(
            state_dir = %dir.root().display(),
            backend = cfg.backend.name(),
            policy = %cfg.policy,
            jobs = table.jobs().len(),
            "serving"
        );
        let mut d = Self {
            cfg,
            dir,
            journal,
            table,
            ledger: Ledger::new(),
            telemetry,
            children: HashMap::new(),
            exiting: Vec::new(),
            usage: HashMap::new(),
            last_energy: HashMap::new(),
            waiting: BTreeMap::new(),
            rr_cursor: 0,
            gpus: Vec::new(),
            lock,
        };
        d.recover()?;
        Ok(d)
    }

    /// Journal `event` (fsync'd) and fold it into the table.
    fn record(&mut self, event: Event) -> Result<()> {
        self.journal.append(&event)?;
        self.table.apply(&event);
        Ok(())
    }

    /// One pass of the loop.
    #[tracing::instrument(skip_all)]
    pub(crate) async fn step(&mut self) -> Result<()> {
        if !lock_still_held(&self.dir, &self.lock) {
            return Err(LocalError::StateDirReplaced(self.dir.root().to_path_buf()));
        }
        let now = now_ms();
        let running = self.running_jobs();
        match self.telemetry.sample(&running, now).await {
            Ok(gpus) => self.gpus = gpus,
            // The last readings stay, with their time: carma-core's staleness rule stops sharing
            // on them once they are too old, and exclusive placement goes on.
            Err(e) => {
                tracing::warn!(error = %e, "cannot sample the GPUs; keeping the last readings")
            }
        }
        self.observe(now);
        // After the first sample: a job asking for more GPUs than there are is refused at once.
        self.ingest_spool()?;
        self.poll_attempts()?;
        self.decide_pending()?;
        self.schedule(now)?;
        self.write_views(now)?;
        Ok(())
    }

    /// Take every submission from the spool into the journal, then remove its file.
    fn ingest_spool(&mut self) -> Result<()> {
        for (spec, path) in read_spool(&self.dir)? {
            if !self.table.contains(&spec.id) {
                tracing::info!(job = %spec.id, name = %spec.name, gpus = spec.gpus, reservation = %spec.reservation, "submitted");
                let id = spec.id.clone();
                self.record(Event::Submitted {
                    job: spec,
                    at_ms: now_ms(),
                })?;
                self.refuse_if_unplaceable(&id)?;
            }
            if let Err(e) = std::fs::remove_file(&path) {
                tracing::warn!(file = %path.display(), error = %e, "cannot remove a taken submission");
            }
        }
        Ok(())
    }

    fn running_jobs(&self) -> Vec<JobOnGpus> {
        self.table
            .jobs()
            .into_iter()
            .filter_map(|j| {
                let a = j.running()?;
                Some(JobOnGpus {
                    id: j.spec.id.clone(),
                    uuids: a.uuids.clone(),
                    // What a simulated job uses unless it declares otherwise: what it asked
                    // for, not the whole GPU an exclusive placement books.
                    reserved_mib: match a.reservation {
                        carma_core::Reservation::Mib(m) => m.min(a.reserved_mib),
                        _ => a.reserved_mib,
                    },
                    launcher_pid: a.pid,
                    launched_at_ms: a.launched_at_ms,
                    dir: self.dir.attempt(&j.spec.id, a.number),
                })
            })
            .collect()
    }

    /// Fold the latest readings into each running job's totals; a job whose memory shows on all its
    /// GPUs is no longer in flight for the ledger.
    fn observe(&mut self, now: Millis) {
        let mut energy_delta: HashMap<String, f64> = HashMap::new();
        for r in &self.gpus {
            if let Some(e) = r.energy_j
                && let Some(prev) = self.last_energy.insert(r.gpu.uuid.clone(), e)
            {
                energy_delta.insert(r.gpu.uuid.clone(), (e - prev).max(0.0));
            }
        }
        for job in self.running_jobs() {
            let totals = self.usage.entry(job.id.clone()).or_default();
            totals.samples += 1;
            let mut seen_everywhere = true;
            for uuid in &job.uuids {
                let Some(r) = self.gpus.iter().find(|r| &r.gpu.uuid == uuid) else {
                    seen_everywhere = false;
                    continue;
                };
                match r.jobs_mib.get(&job.id) {
                    Some(mib) => totals.peak_mib = Some(totals.peak_mib.unwrap_or(0).max(*mib)),
                    // Without a process list (dcgm-exporter alone) nothing can show the job: once
                    // its warm-up has passed, its memory is taken to be in telemetry's figures.
                    None if !r.processes_listed
                        && now
                            >= job
                                .launched_at_ms
                                .saturating_add(self.cfg.placement.warmup_ms) => {}
                    None => seen_everywhere = false,
                }
                if let Some(sm) = r.sm_activity_now {
                    totals.sm_sum += sm;
                    totals.sm_samples += 1;
                }
                if let Some(delta) = energy_delta.get(uuid) {
                    let sharers = self.ledger.pods_on(uuid).max(1) as f64;
                    totals.energy_j = Some(totals.energy_j.unwrap_or(0.0) + delta / sharers);
                }
            }
            if seen_everywhere {
                self.ledger.confirm(&job.id);
            }
        }
    }

    /// `gpus.json` for `status`, one `telemetry.jsonl` line for `report`.
    fn write_views(&self, now: Millis) -> Result<()> {
        let simulated = matches!(self.cfg.backend, BackendChoice::Simulated(..));
        let gpus: Vec<serde_json::Value> = self
            .gpus
            .iter()
            .map(|r| {
                let g = &r.gpu;
                json!({
                    "index": g.index,
                    "uuid": g.uuid,
                    "model": g.model,
                    "healthy": g.healthy,
                    "memory_total_mib": g.memory_total_mib,
                    "memory_used_mib": r.used_mib,
                    "memory_free_mib": g.memory_free_mib,
                    "reserved_mib": self.ledger.reserved_mib(&g.uuid),
                    "sm_activity_risk": g.sm_activity,
                    "sm_occupancy_risk": g.sm_occupancy,
                    "dram_activity_risk": g.dram_activity,
                    "gate_rule": g.gate_rule.as_str(),
                    "activity_source": r.activity_source,
                    "power_w": r.power_w,
                    "energy_j": r.energy_j,
                    "jobs": self.ledger.on_gpu(&g.uuid).iter().map(|p| p.pod.clone()).collect::<Vec<_>>(),
                    "simulated": simulated,
                })
            })
            .collect();
        let view = json!({
            "backend": self.cfg.backend.name(),
            "simulated": simulated,
            "policy": self.cfg.policy.as_str(),
            "taken_at_ms": now,
            "daemon_pid": std::process::id(),
            "gpus": gpus,
            "waiting": self.waiting,
        });
        write_atomic(&self.dir.gpus(), view.to_string().as_bytes())?;
        let line = json!({
            "t_ms": now,
            "simulated": simulated,
            "gpus": self.gpus.iter().map(|r| json!({
                "index": r.gpu.index,
                "total_mib": r.gpu.memory_total_mib,
                "used_mib": r.used_mib,
                "reserved_mib": self.ledger.reserved_mib(&r.gpu.uuid),
                "sm_activity": r.sm_activity_now,
                "power_w": r.power_w,
                "energy_j": r.energy_j,
                "jobs": self.ledger.pods_on(&r.gpu.uuid),
            })).collect::<Vec<_>>(),
        });
        append_line(&self.dir.telemetry(), &line.to_string(), false)
    }

    /// Whether some job was taken and nothing is spooled, queued or running now.
    fn idle(&self) -> Result<bool> {
        let jobs = self.table.jobs();
        Ok(!jobs.is_empty()
            && read_spool(&self.dir)?.is_empty()
            && jobs
                .iter()
                .all(|j| matches!(j.state, JobState::Succeeded | JobState::Failed)))
    }
}
