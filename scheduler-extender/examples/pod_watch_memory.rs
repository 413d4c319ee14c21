//! What the extender's pod watch costs on a busy cluster: `--pods` (default 50,000) running
//! Deployment pods carma does not place (`synthetic::deployment_pod_json`, ~9 KiB of JSON each)
//! are listed in pages of 500 as the watcher lists them, decoded, and fed to
//! `Extender::observe_pod`, as `kube_backend::spawn_watchers` does; the UIDs a re-list collects
//! are kept as `drive` keeps them.
//!
//! `--decode full` decodes each pod as a full `Pod` (the watch before `WatchedPod`), `--decode
//! watched` as a `WatchedPod`. `--keep` also holds every decoded pod, as a reflector store would.
//! Prints the CPU time per pod (decode and observe) and the peak resident memory of the listing above the process's
//! resident memory once the `--nodes`-node cluster (default 5,000) is loaded (the peak is reset
//! first through `/proc/self/clear_refs`; Linux only). Loading a large cluster leaves freed heap
//! that the listing reuses without growing the process, so memory is measured with `--nodes 1`.
//!
//! `--filter-secs S` then measures filter + prioritize throughput for one GPU pod against
//! `--nodes` nodes for S seconds, while another thread replays the pods' events at `--events-per-sec`
//! (default 1,000: every pod changes every 50 s); compare with `--pods 0`.
//!
//! ```text
//! cargo run --release -p carma-scheduler-extender --example pod_watch_memory -- --decode full
//! cargo run --release -p carma-scheduler-extender --example pod_watch_memory -- --decode watched
//! ```

use std::collections::HashSet;
use std::io::{BufRead, Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use carma_core::{PlacementConfig, Policy};
use carma_scheduler_extender::synthetic::{
    deployment_pod_json, extender_args_body, loaded_cluster,
};
use carma_scheduler_extender::watched_pod::WatchedPod;
use carma_scheduler_extender::wire::ExtenderArgs;
use carma_scheduler_extender::{Extender, snapshot_extender};
use k8s_openapi::api::core::v1::Pod;
use serde::de::DeserializeOwned;

const PAGE: usize = 500;

fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// CPU time this thread has run, from the scheduler's accounting (waiting for a CPU on a busy
/// machine does not count).
fn cpu_time() -> Duration {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .map_or(Duration::ZERO, Duration::from_nanos)
}

/// One page of the list, as the API server sends it.
fn page_bytes(from: usize, to: usize) -> Vec<u8> {
    let items: Vec<_> = (from..to)
        .map(|i| deployment_pod_json(i, &format!("cpu-node-{:05}", i % 5_000)))
        .collect();
    serde_json::to_vec(&serde_json::json!({
        "apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "1"}, "items": items
    }))
    .unwrap_or_default()
}

#[derive(serde::Deserialize)]
struct List<K> {
    items: Vec<K>,
}

/// Decode the pages and feed each pod to the extender; returns the decode + observe time and the
/// pods held when `keep`.
fn list<K: DeserializeOwned>(
    pages: impl Iterator<Item = Vec<u8>>,
    ext: &Extender,
    pod: impl Fn(&K) -> &Pod,
    key: impl Fn(&K) -> Option<String>,
    keep: bool,
) -> (Duration, Vec<K>, HashSet<String>) {
    let mut held = Vec::new();
    let mut seen = HashSet::new();
    let mut spent = Duration::ZERO;
    for bytes in pages {
        let start = cpu_time();
        let page: List<K> = serde_json::from_slice(&bytes).expect("a pod list");
        drop(bytes);
        for o in page.items {
            if let Some(k) = key(&o) {
                seen.insert(k);
            }
            ext.observe_pod(pod(&o));
            if keep {
                held.push(o);
            }
        }
        spent += cpu_time().saturating_sub(start);
    }
    (spent, held, seen)
}

fn main() {
    let mut decode = "watched".to_string();
    let mut pods = 50_000usize;
    let mut keep = false;
    let mut filter_secs = 0u64;
    let mut rate = 1_000u64;
    let mut nodes = 5_000usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--decode" => decode = args.next().expect("full or watched"),
            "--pods" => pods = args.next().and_then(|v| v.parse().ok()).expect("a count"),
            "--keep" => keep = true,
            "--nodes" => nodes = args.next().and_then(|v| v.parse().ok()).expect("a count"),
            "--filter-secs" => {
                filter_secs = args.next().and_then(|v| v.parse().ok()).expect("seconds")
            }
            "--emit-pages" => {
                let n: usize = args.next().and_then(|v| v.parse().ok()).expect("a count");
                let mut out = std::io::stdout().lock();
                for from in (0..n).step_by(PAGE) {
                    let page = page_bytes(from, (from + PAGE).min(n));
                    if writeln!(out, "{}", page.len())
                        .and_then(|()| out.write_all(&page))
                        .is_err()
                    {
                        return;
                    }
                }
                return;
            }
            "--events-per-sec" => rate = args.next().and_then(|v| v.parse().ok()).expect("a rate"),
            other => panic!("unknown argument {other}"),
        }
    }
    let ext = snapshot_extender(
        &loaded_cluster(nodes, 8),
        Policy::Magm,
        PlacementConfig::default(),
        Default::default(),
    )
    .expect("estimator loads");
    // The pages come from a child process over a pipe, one at a time, as the watcher reads them
    // from its connection: this process holds one page's bytes at a time, and the heap freed by
    // generating them is not there for the listing to reuse. Nothing is written to disk.
    let mut child = std::process::Command::new(std::env::current_exe().expect("this program"))
        .args(["--emit-pages", &pods.to_string()])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("the page generator starts");
    let mut pipe = std::io::BufReader::new(child.stdout.take().expect("a pipe"));
    let mut bytes = 0u64;
    let mut kept_pages = Vec::new();
    let pages = std::iter::from_fn(|| {
        let mut len = String::new();
        pipe.read_line(&mut len).ok()?;
        let len: usize = len.trim().parse().ok()?;
        let mut page = vec![0; len];
        pipe.read_exact(&mut page).ok()?;
        bytes += len as u64;
        // The throughput run replays the first pages.
        if filter_secs > 0 && kept_pages.len() < 10 {
            kept_pages.push(page.clone());
        }
        Some(page)
    });
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let base = status_kib("VmRSS:");
    let (spent, held_len, seen_len) = match decode.as_str() {
        "full" => {
            let (t, h, s) = list::<Pod>(pages, &ext, |p| p, |p| p.metadata.uid.clone(), keep);
            (t, h.len(), s.len())
        }
        "watched" => {
            let (t, h, s) = list::<WatchedPod>(
                pages,
                &ext,
                |w| &w.pod,
                |w| w.carma.then(|| w.pod.metadata.uid.clone()).flatten(),
                keep,
            );
            (t, h.len(), s.len())
        }
        other => panic!("--decode full or watched, not {other}"),
    };
    let peak = status_kib("VmHWM:");
    let _ = child.wait();
    let pages = kept_pages;
    println!(
        "decode={decode} pods={pods} json={:.1} MiB keep={keep}: {:.1} us CPU/pod, peak RSS {:.1} MiB above the loaded extender of {nodes} nodes ({:.1} MiB), {held_len} pods held, {seen_len} UIDs collected",
        bytes as f64 / 1048576.0,
        spent.as_secs_f64() * 1e6 / pods.max(1) as f64,
        peak.saturating_sub(base) as f64 / 1024.0,
        base as f64 / 1024.0,
    );
    if filter_secs == 0 {
        return;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let churn = (pods > 0).then(|| {
        let (ext, stop, decode) = (Arc::clone(&ext), Arc::clone(&stop), decode.clone());
        std::thread::spawn(move || {
            let per_page = Duration::from_secs_f64(PAGE as f64 / rate.max(1) as f64);
            let mut events = 0usize;
            'outer: loop {
                for page in &pages {
                    if stop.load(Ordering::Relaxed) {
                        break 'outer;
                    }
                    let start = Instant::now();
                    let one = std::iter::once(page.clone());
                    if decode == "full" {
                        list::<Pod>(one, &ext, |p| p, |_| None, false);
                    } else {
                        list::<WatchedPod>(one, &ext, |w| &w.pod, |_| None, false);
                    }
                    events += PAGE;
                    std::thread::sleep(per_page.saturating_sub(start.elapsed()));
                }
            }
            events
        })
    });
    let body = extender_args_body(nodes, true);
    let start = Instant::now();
    let cpu = cpu_time();
    let mut n = 0u64;
    while start.elapsed() < Duration::from_secs(filter_secs) {
        let args: ExtenderArgs = serde_json::from_slice(&body).expect("args");
        std::hint::black_box(serde_json::to_vec(&ext.filter(&args)).expect("json"));
        std::hint::black_box(serde_json::to_vec(&ext.prioritize(&args)).expect("json"));
        n += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    let cpu = cpu_time().saturating_sub(cpu).as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let events = churn.map_or(0, |t| t.join().unwrap_or(0));
    println!(
        "filter+prioritize against {nodes} nodes: {:.0} pods/s over {secs:.1} s ({:.0} us CPU each), {:.0} pod events/s replayed",
        n as f64 / secs,
        cpu * 1e6 / n.max(1) as f64,
        events as f64 / secs
    );
}
