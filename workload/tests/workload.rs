//! The workload on its own: it runs every phase in order, logs a well-formed ground truth and
//! really calls the doubles (its per-phase iteration counts say so).

use std::process::Command;

#[test]
fn runs_the_four_phases_in_order_and_logs_the_ground_truth() {
    let dir = std::env::temp_dir().join(format!("ml-workload-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (log, ready, stats) = (dir.join("truth.jsonl"), dir.join("ready"), dir.join("stats.json"));
    let status = Command::new(env!("CARGO_BIN_EXE_ml-workload"))
        .args(["--phase-ms", "200", "--cycles", "2"])
        .arg("--log")
        .arg(&log)
        .arg("--ready")
        .arg(&ready)
        .arg("--stats")
        .arg(&stats)
        .status()
        .unwrap();
    assert!(status.success());
    let pid: u32 = std::fs::read_to_string(&ready).unwrap().parse().unwrap();
    let lines: Vec<serde_json::Value> =
        std::fs::read_to_string(&log).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let phases: Vec<&str> = lines.iter().map(|l| l["phase"].as_str().unwrap()).collect();
    assert_eq!(phases, ["data_loading", "gpu_compute", "nccl_collective", "optimizer_step"].repeat(2));
    let mut previous_end = 0;
    for line in &lines {
        let (start, end) = (line["start_ms"].as_u64().unwrap(), line["end_ms"].as_u64().unwrap());
        assert!(end - start >= 200 && end - start < 400, "{line}");
        assert!(start >= previous_end, "phases do not overlap");
        previous_end = end;
        assert_eq!(line["pid"], pid);
    }
    let stats: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    // 400 ms per phase: batches every ~5 ms, GPU iterations of ~4 ms, collectives of ~1-2 ms,
    // optimizer steps of ~2 ms.
    for phase in ["data_loading", "gpu_compute", "nccl_collective", "optimizer_step"] {
        assert!(stats[phase]["n"].as_u64().unwrap() >= 20, "{phase}: {stats}");
    }
    assert!(stats["gpu_compute"]["p50_ms"].as_f64().unwrap() >= 4.0, "20 kernels of 200 µs: {stats}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_arguments_are_refused_clearly() {
    let out = Command::new(env!("CARGO_BIN_EXE_ml-workload")).arg("--cycles").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--cycles needs a value"));
    let out = Command::new(env!("CARGO_BIN_EXE_ml-workload")).args(["--doubles", "/nonexistent"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("dlopen"));
}
