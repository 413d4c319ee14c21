//! Import of CARMA's traces: a shell script of `submit.py --task X.rad` and
//! `sleep N` lines, `.rad` task files, and a CSV of exclusive run times.
//!
//! `.rad` lines (0-based): 0 comment; 1 conda env; 2 command; 3 model-summary
//! file; 4 data set; 5 batch size; 6 `exclusive`; 7 GPUs; 8 measured peak memory
//! per GPU (MiB); 9 Horus; 10 FakeTensor; 11 GPUMemNet estimate (MiB). 40000
//! means "not available". Task paths in the script may be absolute: only the
//! base name is used, looked up in the workloads folder.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use carma_core::Millis;

use crate::catalog::{self, SizeClass};
use crate::config::{MAX_ARRIVAL_MS, MAX_GPU_MEMORY_MIB, MAX_GPUS_PER_NODE, MAX_RUN_MS, MAX_TASKS};
use crate::error::SimError;
use crate::model::ActivityClass;
use crate::task::Task;
use crate::trace::Trace;

/// "Not available / whole GPU" in CARMA's task files.
pub const NOT_AVAILABLE_MIB: u64 = 40_000;

/// Largest batch size a `.rad` file may give: 2^20, 32 × DLRM's 32,768 (the
/// largest in CARMA's traces); the activity model only needs it as a number.
pub const MAX_BATCH_SIZE: u32 = 1 << 20;

/// Longest exclusive run time in the durations CSV, in minutes (one year).
pub const MAX_RUN_MINUTES: f64 = (MAX_RUN_MS / 60_000) as f64;

/// The three inputs of an import.
#[derive(Debug, Clone)]
pub struct ImportPaths {
    /// The trace script (`philly_mix-90-tasks.sh`).
    pub trace: PathBuf,
    /// Folder of `.rad` task files.
    pub workloads: PathBuf,
    /// CSV `rad,exclusive_minutes`.
    pub durations: PathBuf,
}

fn read(path: &Path) -> Result<String, SimError> {
    fs::read_to_string(path).map_err(|source| SimError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Read a trace and everything it refers to.
pub fn import(paths: &ImportPaths) -> Result<Trace, SimError> {
    let submissions = parse_script(&paths.trace, &read(&paths.trace)?)?;
    let durations = parse_durations(&paths.durations, &read(&paths.durations)?)?;
    if submissions.is_empty() {
        return Err(SimError::Input {
            path: paths.trace.clone(),
            message: "no `submit.py --task …` line: the trace has no task".into(),
        });
    }
    let mut files: HashMap<String, RadFile> = HashMap::new();
    let mut tasks = Vec::with_capacity(submissions.len());
    for (id, sub) in submissions.iter().enumerate() {
        if !files.contains_key(&sub.rad) {
            let path = paths.workloads.join(&sub.rad);
            let text = read(&path).map_err(|e| match e {
                SimError::Io { path, source } => SimError::Input {
                    path: paths.trace.clone(),
                    message: format!(
                        "line {}: task file {} cannot be read: {source}",
                        sub.line,
                        path.display()
                    ),
                },
                other => other,
            })?;
            files.insert(sub.rad.clone(), parse_rad(&path, &text)?);
        }
        let rad = &files[&sub.rad];
        let minutes = durations.get(&sub.rad).ok_or_else(|| SimError::Input {
            path: paths.durations.clone(),
            message: format!(
                "no exclusive run time for {} (used at {}:{})",
                sub.rad,
                paths.trace.display(),
                sub.line
            ),
        })?;
        tasks.push(task_from_rad(id, &sub.rad, rad, *minutes, sub.at_ms));
    }
    let name = paths.trace.file_name().map_or_else(
        || paths.trace.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    Ok(Trace {
        description: format!("{} tasks from CARMA trace {name}", tasks.len()),
        tasks,
    })
}

fn task_from_rad(id: usize, rad_name: &str, rad: &RadFile, minutes: f64, at_ms: Millis) -> Task {
    let workload = catalog::by_rad(rad_name);
    let activity = match workload {
        Some(w) => w.class.activity(rad.batch_size),
        None => ActivityClass::Vision.activity(rad.batch_size),
    };
    let size = match workload {
        Some(w) => w.size,
        None if rad.gpus > 1 => SizeClass::Heavy,
        None => SizeClass::Medium,
    };
    Task {
        id,
        name: rad_name.trim_end_matches(".rad").to_string(),
        arrival_ms: at_ms,
        gpus: rad.gpus,
        exclusive_ms: (minutes * 60_000.0).round() as Millis,
        peak_mib: rad.peak_mib,
        recorded_mib: rad.gpumemnet_mib,
        activity,
        size,
        workload,
    }
}

/// One `submit.py` line of a trace script.
#[derive(Debug, Clone, PartialEq)]
pub struct Submission {
    /// Base name of the task file.
    pub rad: String,
    /// Submission time.
    pub at_ms: Millis,
    /// 1-based line in the script.
    pub line: usize,
}

/// Parse a trace script: `… submit.py --task PATH` and `sleep N` lines; blank
/// lines, comments and a shebang are skipped, anything else is an error.
pub fn parse_script(path: &Path, text: &str) -> Result<Vec<Submission>, SimError> {
    let mut now_ms: Millis = 0;
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let l = raw.trim();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        let words: Vec<&str> = l.split_whitespace().collect();
        if words[0] == "sleep" {
            let max_s = MAX_ARRIVAL_MS / 1000;
            let secs = words
                .get(1)
                .and_then(|w| w.trim_end_matches('s').parse::<f64>().ok())
                .filter(|s| s.is_finite() && *s >= 0.0)
                .ok_or_else(|| {
                    SimError::parse(path, line, format!("expected `sleep SECONDS`, found {l:?}"))
                })?;
            if words.len() > 2 {
                return Err(SimError::parse(
                    path,
                    line,
                    format!("unexpected text after sleep: {l:?}"),
                ));
            }
            // Checked before converting: `1e99 as u64` would saturate, and the sum wrap.
            if secs > max_s as f64 {
                return Err(SimError::parse(
                    path,
                    line,
                    format!(
                        "sleep {} s is out of range: 0 to {max_s} s (ten years)",
                        words[1]
                    ),
                ));
            }
            now_ms += (secs * 1000.0).round() as Millis;
            if now_ms > MAX_ARRIVAL_MS {
                return Err(SimError::parse(
                    path,
                    line,
                    format!(
                        "the sleeps up to here add up to {} s; a trace may span at most {max_s} s (ten years)",
                        now_ms / 1000
                    ),
                ));
            }
            continue;
        }
        if words.iter().any(|w| w.ends_with("submit.py")) {
            let pos = words.iter().position(|w| *w == "--task").ok_or_else(|| {
                SimError::parse(
                    path,
                    line,
                    format!("submit line without `--task FILE`: {l:?}"),
                )
            })?;
            let file = words.get(pos + 1).ok_or_else(|| {
                SimError::parse(path, line, "`--task` is not followed by a task file")
            })?;
            let base = file.rsplit(['/', '\\']).next().unwrap_or(file);
            if !base.ends_with(".rad") {
                return Err(SimError::parse(
                    path,
                    line,
                    format!("task file {file:?} does not end in .rad"),
                ));
            }
            if out.len() == MAX_TASKS {
                return Err(SimError::parse(
                    path,
                    line,
                    format!(
                        "more than {MAX_TASKS} tasks; the simulator replays at most {MAX_TASKS}"
                    ),
                ));
            }
            out.push(Submission {
                rad: base.to_string(),
                at_ms: now_ms,
                line,
            });
            continue;
        }
        return Err(SimError::parse(
            path,
            line,
            format!("expected `python … submit.py --task FILE.rad` or `sleep N`, found {l:?}"),
        ));
    }
    Ok(out)
}

/// The fields of a `.rad` task file the simulator uses.
#[derive(Debug, Clone, PartialEq)]
pub struct RadFile {
    /// Batch size (line 5).
    pub batch_size: u32,
    /// GPUs (line 7).
    pub gpus: u32,
    /// Measured peak memory per GPU in MiB (line 8).
    pub peak_mib: u64,
    /// GPUMemNet estimate in MiB (line 11), `None` when absent or 40000.
    pub gpumemnet_mib: Option<u64>,
}

/// Parse a `.rad` task file.
pub fn parse_rad(path: &Path, text: &str) -> Result<RadFile, SimError> {
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    let field = |idx: usize, what: &str| -> Result<f64, SimError> {
        let v = lines
            .get(idx)
            .copied()
            .filter(|s| !s.is_empty())
            .ok_or_else(|| SimError::Input {
                path: path.to_path_buf(),
                message: format!(
                    "the file ends before line {} (0-based {idx}: {what}); the simulator needs it",
                    idx + 1
                ),
            })?;
        v.parse::<f64>()
            .ok()
            .filter(|x| x.is_finite() && *x >= 0.0)
            .ok_or_else(|| SimError::parse(path, idx + 1, format!("{what} is {v:?}, not a number")))
    };
    // Every value is range-checked as f64 before it becomes an integer.
    let count = |idx: usize, what: &str, max: u32| -> Result<u32, SimError> {
        let v = field(idx, what)?;
        if v.fract() != 0.0 || !(1.0..=f64::from(max)).contains(&v) {
            return Err(SimError::parse(
                path,
                idx + 1,
                format!(
                    "{what} is {}; it must be a whole number from 1 to {max}",
                    lines[idx]
                ),
            ));
        }
        Ok(v as u32)
    };
    let mib = |idx: usize, what: &str| -> Result<f64, SimError> {
        let v = field(idx, what)?;
        if v > MAX_GPU_MEMORY_MIB as f64 {
            return Err(SimError::parse(
                path,
                idx + 1,
                format!(
                    "{what} is {}; it must be at most {MAX_GPU_MEMORY_MIB} MiB (1 TiB)",
                    lines[idx]
                ),
            ));
        }
        Ok(v)
    };
    let batch_size = count(5, "batch size", MAX_BATCH_SIZE)?;
    let gpus = count(7, "number of GPUs", MAX_GPUS_PER_NODE)?;
    let peak = mib(8, "measured peak memory per GPU (MiB)")?;
    if peak <= 0.0 {
        return Err(SimError::parse(path, 9, "measured peak memory is 0"));
    }
    let gpumemnet_mib = match lines.get(11).copied().filter(|s| !s.is_empty()) {
        None => None,
        Some(_) => {
            let v = mib(11, "GPUMemNet estimate (MiB)")?.ceil() as u64;
            (v != NOT_AVAILABLE_MIB && v > 0).then_some(v)
        }
    };
    Ok(RadFile {
        batch_size,
        gpus,
        peak_mib: peak.ceil() as u64,
        gpumemnet_mib,
    })
}

/// Parse `rad,exclusive_minutes` (a header line is allowed). Run times must be
/// in (0, [`MAX_RUN_MINUTES`]]; a task listed twice is an error (naming both lines).
pub fn parse_durations(path: &Path, text: &str) -> Result<HashMap<String, f64>, SimError> {
    let mut out = HashMap::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let l = raw.trim();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        let mut cols = l.split(',').map(str::trim);
        let (Some(name), Some(minutes), None) = (cols.next(), cols.next(), cols.next()) else {
            return Err(SimError::parse(
                path,
                line,
                format!("expected `task.rad,minutes`, found {l:?}"),
            ));
        };
        match minutes.parse::<f64>() {
            Ok(m) if m.is_finite() && m > 0.0 && m <= MAX_RUN_MINUTES => {
                if let Some(first) = seen.insert(name.to_string(), line) {
                    return Err(SimError::parse(
                        path,
                        line,
                        format!("{name} is listed twice (first at line {first})"),
                    ));
                }
                out.insert(name.to_string(), m);
            }
            Err(_) if line == 1 => {} // header
            _ => {
                return Err(SimError::parse(
                    path,
                    line,
                    format!(
                        "run time {minutes:?} of {name} is out of range: more than 0 and at most {MAX_RUN_MINUTES} minutes (one year)"
                    ),
                ));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_with_absolute_paths_and_sleeps() {
        let text = "#!/bin/sh\nsleep 0\npython /x/src/submit.py --task /x/workloads/a.rad\nsleep 5\npython src/submit.py --task workloads/b.rad\n";
        let subs = parse_script(Path::new("t.sh"), text).unwrap();
        assert_eq!(subs.len(), 2);
        assert_eq!(subs[0].rad, "a.rad");
        assert_eq!(subs[1].at_ms, 5000);
        assert_eq!(subs[1].line, 5);
    }

    #[test]
    fn malformed_script_line_names_the_line() {
        let err = parse_script(Path::new("t.sh"), "sleep 1\nrm -rf /\n").unwrap_err();
        assert!(err.to_string().starts_with("t.sh:2:"), "{err}");
        let err = parse_script(Path::new("t.sh"), "sleep soon\n").unwrap_err();
        assert!(err.to_string().contains("t.sh:1:"), "{err}");
    }

    #[test]
    fn rad_file_fields() {
        let text = "# c\nconda\npython x.py\nx.model\nimagenet\n64\nexclusive\n1\n7106\n14910.3711\n5337.0131\n16000";
        let r = parse_rad(Path::new("resnet2.rad"), text).unwrap();
        assert_eq!(
            r,
            RadFile {
                batch_size: 64,
                gpus: 1,
                peak_mib: 7106,
                gpumemnet_mib: Some(16000)
            }
        );
        let na = text.replace("16000", "40000");
        assert_eq!(
            parse_rad(Path::new("r.rad"), &na).unwrap().gpumemnet_mib,
            None
        );
    }

    #[test]
    fn short_rad_file_is_an_error_naming_the_field() {
        let text = "# c\nconda\npython x.py\nx.model\nwiki\n2\nexclusive\n1";
        let err = parse_rad(Path::new("gpt2_xl.rad"), text)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("gpt2_xl.rad") && err.contains("peak memory"),
            "{err}"
        );
        let bad = "# c\nconda\npython x.py\nx.model\nwiki\nlots\nexclusive\n1\n100";
        let err = parse_rad(Path::new("b.rad"), bad).unwrap_err().to_string();
        assert!(err.starts_with("b.rad:6:"), "{err}");
    }

    #[test]
    fn durations_with_header() {
        let d = parse_durations(
            Path::new("d.csv"),
            "rad,exclusive_minutes\na.rad,2\nb.rad,1.5\n",
        )
        .unwrap();
        assert_eq!(d["b.rad"], 1.5);
        let err = parse_durations(Path::new("d.csv"), "rad,m\na.rad,-1\n").unwrap_err();
        assert!(err.to_string().starts_with("d.csv:2:"));
    }
}
