//! Attribute a host process to a Kubernetes pod through its cgroup path.
//!
//! Kubelet puts every container in a cgroup whose path contains the pod UID:
//! `…/kubepods/burstable/pod<uid>/<container>` with the cgroupfs driver, and
//! `…/kubepods-burstable-pod<uid_with_underscores>.slice/…` with the systemd driver (cgroup v1 or
//! v2). [`pod_uid_from_cgroup`] reads `/proc/<pid>/cgroup` text and returns the UID.

use std::path::Path;

/// The pod UID in the contents of a `/proc/<pid>/cgroup` file, if the process runs in a pod.
pub fn pod_uid_from_cgroup(contents: &str) -> Option<String> {
    contents.lines().find_map(|line| {
        // `hierarchy-ID:controller-list:path`; the path may itself contain ':'.
        let path = line.splitn(3, ':').nth(2)?;
        path.split('/').find_map(uid_in_segment)
    })
}

/// The UID in one path segment such as `pod1b2c…` or `kubepods-besteffort-pod1b2c_….slice`.
fn uid_in_segment(segment: &str) -> Option<String> {
    let segment = segment.strip_suffix(".slice").unwrap_or(segment);
    let start = segment.rfind("pod")? + 3;
    let candidate = &segment[start..];
    let uid = candidate.replace('_', "-");
    is_uid(&uid).then_some(uid)
}

/// Whether `s` is a UID in the 8-4-4-4-12 hex form.
fn is_uid(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    parts.len() == 5
        && parts
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(p, len)| p.len() == len && p.chars().all(|c| c.is_ascii_hexdigit()))
}

/// Read `<proc_root>/<pid>/cgroup` and return the pod UID; `None` when unreadable or not in a pod.
pub fn pod_uid_for_pid(proc_root: &Path, pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(proc_root.join(pid.to_string()).join("cgroup")).ok()?;
    pod_uid_from_cgroup(&text)
}

/// Whether `<proc_root>/<pid>/comm` names an MPS control daemon or server process.
pub fn is_mps_process(proc_root: &Path, pid: u32) -> bool {
    std::fs::read_to_string(proc_root.join(pid.to_string()).join("comm"))
        .map(|c| c.trim().starts_with("nvidia-cuda-mps"))
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "1b2c3d4e-5f60-4718-8a9b-0c1d2e3f4a5b";

    #[test]
    fn cgroupfs_driver_v1() {
        let text = format!(
            "12:memory:/kubepods/burstable/pod{UID}/0123456789abcdef\n11:cpu,cpuacct:/kubepods/burstable/pod{UID}/0123456789abcdef\n"
        );
        assert_eq!(pod_uid_from_cgroup(&text).as_deref(), Some(UID));
    }

    #[test]
    fn systemd_driver_v2() {
        let underscored = UID.replace('-', "_");
        let text = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{underscored}.slice/cri-containerd-abcdef.scope\n"
        );
        assert_eq!(pod_uid_from_cgroup(&text).as_deref(), Some(UID));
        let guaranteed = format!("0::/kubepods.slice/kubepods-pod{underscored}.slice/crio-1.scope");
        assert_eq!(pod_uid_from_cgroup(&guaranteed).as_deref(), Some(UID));
    }

    #[test]
    fn host_processes_are_not_pods() {
        for text in [
            "0::/system.slice/sshd.service\n",
            "0::/user.slice/user-1000.slice/session-3.scope\n",
            "0::/\n",
            "",
            "garbage",
            "0::/kubepods.slice/kubepods-podnot-a-uid.slice/x",
        ] {
            assert_eq!(pod_uid_from_cgroup(text), None, "{text:?}");
        }
    }

    #[test]
    fn reads_from_a_proc_tree() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("42");
        std::fs::create_dir_all(&p).unwrap();
        std::fs::write(
            p.join("cgroup"),
            format!("0::/kubepods/besteffort/pod{UID}/c1\n"),
        )
        .unwrap();
        std::fs::write(p.join("comm"), "nvidia-cuda-mps-server\n").unwrap();
        assert_eq!(pod_uid_for_pid(dir.path(), 42).as_deref(), Some(UID));
        assert!(is_mps_process(dir.path(), 42));
        assert_eq!(pod_uid_for_pid(dir.path(), 43), None);
        assert!(!is_mps_process(dir.path(), 43));
    }
}
