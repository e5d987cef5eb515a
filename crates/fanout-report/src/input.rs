//! Reading the figures out of fanout's JSON: a training run's metrics (`fanout train
//! --metrics-out`, one JSON object with an `epochs` array) or cache-sim rows (`fanout cache-sim
//! --json`, one JSON object per line). Only the fields the pictures use are read; each one that
//! is missing or of the wrong type is an error naming the file and the field's path.

use crate::Error;
use serde_json::Value;
use std::path::Path;

/// One epoch of a training run, as drawn.
#[derive(Clone, Debug, PartialEq)]
pub struct Epoch {
    /// Epoch number.
    pub epoch: u64,
    /// Wall time of the epoch (seconds).
    pub wall_s: f64,
    /// Busy time of the sample stage.
    pub sample_s: f64,
    /// Busy time of the extract stage.
    pub extract_s: f64,
    /// Busy time of the train stage, all-reduce excluded.
    pub compute_s: f64,
    /// Time in gradient all-reduce (0 for one worker).
    pub allreduce_s: f64,
    /// The epoch's GEMM flops at the measured GEMM rate, when reported.
    pub compute_floor_s: Option<f64>,
    /// The flops actually done (zero-skipped products left out) at the same rate, when
    /// reported (metrics written before it was have none).
    pub performed_floor_s: Option<f64>,
    /// The epoch's gathered bytes at the measured copy bandwidth, when reported.
    pub memory_floor_s: Option<f64>,
    /// Mean training loss.
    pub loss: f64,
    /// Training accuracy of the epoch's batches.
    pub train_acc: f64,
    /// Validation accuracy, when the epoch was evaluated.
    pub val_acc: Option<f64>,
    /// Share of feature bytes served by the cache (every worker's bytes together).
    pub cache_share: f64,
    /// Share of feature bytes reused from the previous batch (Match-Reorder; every worker's
    /// bytes together).
    pub reuse_share: f64,
}

/// A training run's metrics, as drawn.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainRun {
    /// Model name (`sage`, `gcn`, ...).
    pub model: String,
    /// Dataset path or `embedded`.
    pub dataset: String,
    /// Execution strategy and worker count, e.g. `single`, `data-parallel x2`.
    pub strategy: String,
    /// Test accuracy of the best-validation model (`None`: the run stopped before its end).
    pub test_acc: Option<f64>,
    /// Why the run stopped before its end, when it did.
    pub stopped: Option<String>,
    /// Median epoch wall time.
    pub median_epoch_s: f64,
    /// Median floor of the same epochs, when reported.
    pub median_floor_s: Option<f64>,
    /// The epochs, in order.
    pub epochs: Vec<Epoch>,
}

/// One cache-sim row: a policy at a cache ratio.
#[derive(Clone, Debug, PartialEq)]
pub struct SimRow {
    /// Dataset name.
    pub dataset: String,
    /// Policy (`random`, `degree`, `presc1`, ..., `optimal`).
    pub policy: String,
    /// Cached fraction of the vertices.
    pub ratio: f64,
    /// Share of feature bytes served by the cache.
    pub hit_rate: f64,
    /// Sampler, fanouts (hop order) and batch size, for the title.
    pub setting: String,
}

/// What a metrics file holds.
#[derive(Clone, Debug, PartialEq)]
pub enum Report {
    /// A training run.
    Train(TrainRun),
    /// Cache-sim rows, in file order.
    CacheSim(Vec<SimRow>),
}

/// Reads `path`: one JSON object with `epochs` (a training run), or JSON lines with
/// `policy` and `ratio` (cache-sim). Errors name the file and the line or field.
pub fn load(path: &Path) -> Result<Report, Error> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::new(format!("{}: cannot read: {e}", path.display())))?;
    parse(&text, &path.display().to_string())
}

/// [`load`] on a text already read: `origin` (a file name, or what the text is) begins every
/// error.
pub fn parse(text: &str, origin: &str) -> Result<Report, Error> {
    let at = |what: String| Error::new(format!("{origin}: {what}"));
    let values: Vec<Value> = match serde_json::from_str::<Value>(text) {
        Ok(v) => vec![v],
        Err(whole) => {
            let mut lines = text
                .lines()
                .enumerate()
                .filter(|(_, l)| !l.trim().is_empty());
            let mut values = Vec::new();
            for (i, l) in lines.by_ref() {
                match serde_json::from_str(l) {
                    Ok(v) => values.push(v),
                    // Not even the first line is a JSON value: the text is one document (a
                    // pretty-printed, cut-off metrics file, say), and serde's error says where.
                    Err(_) if values.is_empty() => return Err(at(format!("not JSON ({whole})"))),
                    Err(e) => return Err(at(format!("line {}: not JSON ({e})", i + 1))),
                }
            }
            values
        }
    };
    let first = values
        .first()
        .ok_or_else(|| at("empty; expected fanout's metrics JSON".into()))?;
    if values.len() == 1 && first.get("epochs").is_some() {
        return train_run(first).map(Report::Train).map_err(at);
    }
    if first.get("policy").is_some() {
        let rows = values
            .iter()
            .enumerate()
            .map(|(i, v)| sim_row(v).map_err(|e| at(format!("line {}: {e}", i + 1))))
            .collect::<Result<Vec<_>, _>>()?;
        return Ok(Report::CacheSim(rows));
    }
    Err(at(
        "expected the metrics of `fanout train --metrics-out` (an object with \"epochs\") or \
         the rows of `fanout cache-sim --json` (objects with \"policy\" and \"ratio\")"
            .into(),
    ))
}

fn field<'a>(v: &'a Value, path: &str) -> Result<&'a Value, String> {
    path.split('.').try_fold(v, |v, k| {
        v.get(k)
            .ok_or_else(|| format!("field \"{path}\" is missing"))
    })
}

/// The largest magnitude a drawn figure may have: far beyond any time, loss or byte count a run
/// reports, and small enough that the axes' arithmetic (sums, margins) stays finite.
pub const MAX_MAGNITUDE: f64 = 1e15;

fn num(v: &Value, path: &str) -> Result<f64, String> {
    let x = field(v, path)?;
    x.as_f64()
        .filter(|x| x.abs() <= MAX_MAGNITUDE)
        .ok_or_else(|| {
            format!("field \"{path}\" = {x}; expected a number of magnitude at most 1e15")
        })
}

/// A count: a whole number in `0..=2^32`.
fn count(v: &Value, path: &str) -> Result<u64, String> {
    let x = field(v, path)?;
    x.as_u64()
        .filter(|n| *n <= 1 << 32)
        .ok_or_else(|| format!("field \"{path}\" = {x}; expected a whole number from 0 to 2^32"))
}

/// A number, or `None` when the field is absent or null.
fn opt_num(v: &Value, path: &str) -> Result<Option<f64>, String> {
    match field(v, path) {
        Err(_) | Ok(Value::Null) => Ok(None),
        Ok(_) => num(v, path).map(Some),
    }
}

fn text(v: &Value, path: &str) -> Result<String, String> {
    let x = field(v, path)?;
    x.as_str()
        .map(str::to_string)
        .ok_or_else(|| format!("field \"{path}\" = {x}; expected a string"))
}

fn train_run(v: &Value) -> Result<TrainRun, String> {
    let epochs = field(v, "epochs")?
        .as_array()
        .ok_or("field \"epochs\" is not an array")?;
    if epochs.is_empty() {
        return Err("field \"epochs\" is empty; the run trained no epoch".into());
    }
    let epochs = epochs
        .iter()
        .enumerate()
        .map(|(i, e)| epoch(e).map_err(|m| format!("epochs[{i}]: {m}")))
        .collect::<Result<Vec<_>, _>>()?;
    let workers = match field(v, "workers") {
        Err(_) | Ok(Value::Null) => 1,
        Ok(_) => count(v, "workers")?,
    };
    let strategy = text(v, "strategy")?;
    Ok(TrainRun {
        model: text(v, "model")?,
        dataset: text(v, "dataset")?,
        strategy: if workers > 1 {
            format!("{strategy} x{workers}")
        } else {
            strategy
        },
        test_acc: opt_num(v, "test_acc")?,
        stopped: match field(v, "stopped") {
            Err(_) | Ok(Value::Null) => None,
            Ok(_) => Some(text(v, "stopped")?),
        },
        median_epoch_s: num(v, "median_epoch_s")?,
        median_floor_s: opt_num(v, "median_floor_s")?,
        epochs,
    })
}

fn epoch(e: &Value) -> Result<Epoch, String> {
    let train_s = num(e, "train_s")?;
    let allreduce_s = opt_num(e, "allreduce_s")?.unwrap_or(0.0);
    // The bytes of every worker where the epoch lists them (its own `extract` is then rank
    // 0's alone), else the epoch's `extract`.
    let per_worker: Vec<&Value> = match e.get("workers").and_then(Value::as_array) {
        Some(ws) if !ws.is_empty() && ws.iter().all(|w| w.get("extract").is_some()) => {
            ws.iter().collect()
        }
        _ => vec![e],
    };
    let bytes = |k: &str| -> Result<f64, String> {
        per_worker.iter().enumerate().try_fold(0.0, |sum, (i, w)| {
            let b = num(w, &format!("extract.{k}"));
            b.map(|b| sum + b).map_err(|m| match per_worker.len() {
                1 => m,
                _ => format!("workers[{i}]: {m}"),
            })
        })
    };
    let total = bytes("bytes_total")?;
    let share = |k: &str| -> Result<f64, String> {
        let b = bytes(k)?;
        Ok(if total > 0.0 { b / total } else { 0.0 })
    };
    Ok(Epoch {
        epoch: count(e, "epoch")?,
        wall_s: num(e, "wall_s")?,
        sample_s: num(e, "sample_s")?,
        extract_s: num(e, "extract_s")?,
        compute_s: (train_s - allreduce_s).max(0.0),
        allreduce_s,
        compute_floor_s: opt_num(e, "compute_floor_s")?,
        performed_floor_s: opt_num(e, "performed_floor_s")?,
        memory_floor_s: opt_num(e, "memory_floor_s")?,
        loss: num(e, "loss")?,
        train_acc: num(e, "train_acc")?,
        val_acc: opt_num(e, "val_acc")?,
        cache_share: share("bytes_from_cache")?,
        reuse_share: share("bytes_reused")?,
    })
}

fn sim_row(v: &Value) -> Result<SimRow, String> {
    let batch = num(v, "batch_size")?;
    Ok(SimRow {
        dataset: text(v, "dataset")?,
        policy: text(v, "policy")?,
        ratio: num(v, "ratio")?,
        hit_rate: num(v, "hit_rate")?,
        setting: format!(
            "{}, fanouts {}, batch {batch}",
            text(v, "sampler")?,
            text(v, "fanouts_hop_order")?
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn bad_files_name_the_file_and_the_field_or_line() {
        let t = tempfile::tempdir().unwrap();
        let cases = [
            ("empty.json", "", "empty.json: empty"),
            (
                "garbage.json",
                "{\"a\": 1}\n{oops\n",
                "garbage.json: line 2: not JSON",
            ),
            (
                "cut.json",
                "{\n  \"epochs\": [\n    {\"epoch\": 0,",
                "cut.json: not JSON (EOF while parsing a value at line 3 column",
            ),
            (
                "other.json",
                "{\"a\": 1}",
                "expected the metrics of `fanout train",
            ),
            (
                "noepochs.json",
                "{\"epochs\": []}",
                "field \"epochs\" is empty",
            ),
            (
                "badepoch.json",
                "{\"epochs\": [{\"train_s\": \"slow\"}]}",
                "epochs[0]: field \"train_s\" = \"slow\"; expected a number",
            ),
            (
                "huge.json",
                "{\"epochs\": [{\"train_s\": 1.5e308}]}",
                "epochs[0]: field \"train_s\" = 1.5e+308; expected a number of magnitude at most",
            ),
            (
                "negepoch.json",
                "{\"epochs\": [{\"train_s\": 1, \"extract\": {\"bytes_total\": 0, \
                 \"bytes_from_cache\": 0, \"bytes_reused\": 0}, \"epoch\": -1}]}",
                "epochs[0]: field \"epoch\" = -1; expected a whole number",
            ),
            (
                "fracepoch.json",
                "{\"epochs\": [{\"train_s\": 1, \"extract\": {\"bytes_total\": 0, \
                 \"bytes_from_cache\": 0, \"bytes_reused\": 0}, \"epoch\": 1.5}]}",
                "epochs[0]: field \"epoch\" = 1.5; expected a whole number",
            ),
            (
                "badrow.json",
                "{\"policy\": \"degree\", \"batch_size\": 8}",
                "badrow.json: line 1: field \"dataset\" is missing",
            ),
        ];
        for (name, text, want) in cases {
            let e = load(&write(t.path(), name, text)).unwrap_err().to_string();
            assert!(e.contains(want), "{name}: {e}");
        }
        let e = load(&t.path().join("absent.json")).unwrap_err().to_string();
        assert!(e.contains("absent.json: cannot read"), "{e}");
    }

    #[test]
    fn byte_shares_are_over_every_workers_bytes() {
        let bytes = |total: u64, cache: u64, reused: u64| {
            serde_json::json!({"bytes_total": total, "bytes_from_cache": cache,
                               "bytes_reused": reused, "bytes_from_host": total - cache - reused})
        };
        let run = |workers: Value| {
            serde_json::json!({"model": "sage", "dataset": "d", "strategy": "data-parallel",
                "median_epoch_s": 1.0, "epochs": [{"epoch": 0, "wall_s": 1.0, "sample_s": 0.1,
                "extract_s": 0.1, "train_s": 0.5, "loss": 1.0, "train_acc": 0.5,
                "extract": bytes(100, 10, 0), "workers": workers}]})
            .to_string()
        };
        let shares = |text: String| match parse(&text, "m.json") {
            Ok(Report::Train(r)) => (r.epochs[0].cache_share, r.epochs[0].reuse_share),
            other => panic!("{other:?}"),
        };
        // Two workers: rank 0's bytes are the epoch's own; the shares are over both.
        let two =
            serde_json::json!([{"extract": bytes(100, 10, 0)}, {"extract": bytes(300, 150, 30)}]);
        assert_eq!(shares(run(two)), (160.0 / 400.0, 30.0 / 400.0));
        // One worker, or a file from before workers listed their bytes: the epoch's own.
        assert_eq!(shares(run(serde_json::json!([]))), (0.1, 0.0));
        let old = serde_json::json!([{"bytes_from_host": 90}, {"bytes_from_host": 120}]);
        assert_eq!(shares(run(old)), (0.1, 0.0));
        // A worker's bad field is named with its index.
        let bad =
            serde_json::json!([{"extract": bytes(100, 10, 0)}, {"extract": {"bytes_total": 5}}]);
        let e = parse(&run(bad), "m.json").unwrap_err().to_string();
        assert!(
            e.contains("workers[1]: field \"extract.bytes_from_cache\" is missing"),
            "{e}"
        );
    }
}
