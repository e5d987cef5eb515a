//! Forward and backward of one split mini-batch, rows shuffled between layers.

use super::sample::{Shuffle, SplitBatch, SplitHop};
use crate::error::{ExecError, Result};
use crate::trainer::{BatchOutcome, Trainer};
use fanout_comm::Comm;
use fanout_compute::{Backend, BlockRef, Mode, ModelKind, Tensor};
use std::time::Instant;

/// What one split step did, on this worker and for the whole step.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SplitStep {
    /// The whole step: mean loss over the labelled seeds of all workers, and their counts.
    pub step: BatchOutcome,
    /// This worker's own seeds: their mean loss, correct and labelled counts.
    pub mine: BatchOutcome,
    /// Edges this worker computed whose source it owns.
    pub local_edges: u64,
    /// Edges this worker computed whose source another worker owns.
    pub remote_edges: u64,
    /// Rows this worker received from others: with [`super::Shuffle::Rows`] one per remote
    /// source, reading worker and hop; with [`super::Shuffle::PartialSums`] one per
    /// (destination, other owner) pair and hop.
    pub remote_rows: u64,
    /// Rows it would receive with GSplit's pre-aggregation
    /// ([`super::SplitHop::preaggregated_rows`]; equal to `remote_rows` with partial sums).
    pub preaggregated_rows: u64,
    /// Bytes of rows (forward) and row gradients (backward) this worker sent to others (GCN's
    /// degree exchanges not included).
    pub shuffled_bytes: u64,
    /// Seconds spent in the shuffles (waiting for the other workers included) and the step's
    /// other exchanges (the loss sum, GCN's degrees).
    pub shuffle_s: f64,
    /// Seconds spent in the gradient all-reduce.
    pub allreduce_s: f64,
    /// Bytes this worker contributed to the gradient all-reduce.
    pub allreduce_bytes: u64,
}

/// Runs this worker's share of the split step `batch`: `features` holds the input rows of
/// `batch.owned` (`owned.len() x dim`, row-major). Afterwards every worker of `comm` holds the
/// gradient of the step's mean loss over all labelled seeds, summed over workers: the gradient
/// of the one-worker step on the same batch, up to rounding. Dropout masks are keyed by vertex
/// id, as in the one-worker forward, so they agree too. The optimiser does not step. Every
/// worker must call it for the same step. GCN's `norm="both"` divides by each source's
/// out-degree in the whole batch's block, which no worker's block has alone: the workers
/// first sum their blocks' out-degrees at each source's owner, and every source row is scaled
/// by `sqrt(local degree / global degree)` on its way into the layer (and its gradient on the
/// way out), which turns the local normalisation into the global one. Errors: shapes that do
/// not match the model, a model that cannot take partial sums given them, labels out of range,
/// and communication failures. Some of these fail on one worker only: a caller that gets
/// `Err` must call [`Comm::fail`] (as `fanout_exec::train` does), or the other workers wait in
/// their next collective.
pub fn step<B: Backend>(
    trainer: &mut Trainer<B>,
    batch: &SplitBatch,
    features: Vec<f32>,
    dim: usize,
    comm: &dyn Comm,
    dropout_key: u64,
) -> Result<SplitStep> {
    let model = trainer.model_mut();
    let layers = model.config().num_layers;
    if batch.hops.len() != layers || features.len() != batch.owned.len() * dim {
        return Err(ExecError::Invalid(format!(
            "a split batch of {} hops and {} feature values for {} vertices of width {dim}, \
             for a model of {layers} layers",
            batch.hops.len(),
            features.len(),
            batch.owned.len()
        )));
    }
    let be = model.backend().clone();
    let mut out = SplitStep::default();
    let mut comm_s = 0.0;
    let mut blocks = Vec::with_capacity(layers);
    for i in 0..layers {
        let h = layers - 1 - i;
        let hop = &batch.hops[h];
        let own_rows = batch.reach[h + 1];
        let (local, remote) = hop.local_and_remote_edges(own_rows);
        out.local_edges += local;
        out.remote_edges += remote;
        out.remote_rows += hop.remote_rows() as u64;
        out.preaggregated_rows += hop.preaggregated_rows(own_rows);
        blocks.push(be.prepare_block(&BlockRef {
            num_dst: batch.reach[h],
            num_src: own_rows + hop.remote_rows(),
            indptr: &hop.indptr,
            indices: &hop.indices,
            weights: hop.weights.as_deref(),
        })?);
    }
    let gcn = model.config().kind == ModelKind::Gcn;
    let partial = batch.hops.iter().any(|h| h.serve_groups.is_some());
    if partial && !Shuffle::partial_sums_fit(model.config().kind) {
        return Err(ExecError::Invalid(format!(
            "{:?} layers cannot take partial sums (attention or per-source transforms need \
             every source row): sample with Shuffle::Rows",
            model.config().kind
        )));
    }
    // Each hop's factor per local source row (GCN), and per member of the partial sums this
    // worker sends (1 / group size, GCN: over sqrt(size x the member's degree)).
    let scales = match (gcn, partial) {
        (true, false) => {
            let t = Instant::now();
            let s = gcn_source_scales(batch, comm)?;
            comm_s += t.elapsed().as_secs_f64();
            Some(s)
        }
        (true, true) => Some(gcn_partial_scales(batch)),
        (false, _) => None,
    };
    let coeffs: Vec<Vec<Vec<f32>>> = batch
        .hops
        .iter()
        .enumerate()
        .map(|(h, hop)| member_coefficients(hop, batch.reach[h + 1], gcn))
        .collect();
    let mode = Mode::Train { dropout_key };
    let mut own = Tensor::new(batch.owned.len(), dim, features);
    let mut logits = None;
    for (i, block) in blocks.iter().enumerate() {
        let h = layers - 1 - i;
        let hop = &batch.hops[h];
        let d = own.cols();
        // The rows other workers' edges read from this worker (or their partial sums), then
        // theirs for this one.
        let send: Vec<Vec<f32>> = match &hop.serve_groups {
            None => hop
                .serve
                .iter()
                .map(|at| {
                    at.iter()
                        .flat_map(|&r| own.row(r as usize))
                        .copied()
                        .collect()
                })
                .collect(),
            Some(groups) => (0..hop.serve.len())
                .map(|p| partial_sums(&own, &hop.serve[p], &groups[p], &coeffs[h][p]))
                .collect(),
        };
        out.shuffled_bytes += send.iter().map(|s| 4 * s.len() as u64).sum::<u64>();
        let t = Instant::now();
        let got = comm.all_to_all_v_f32(&send)?;
        comm_s += t.elapsed().as_secs_f64();
        let own_rows = batch.reach[h + 1];
        let mut src = Vec::with_capacity((own_rows + hop.remote_rows()) * d);
        src.extend_from_slice(&own.data()[..own_rows * d]);
        for (p, rows) in got.iter().enumerate() {
            if rows.len() != hop.remote_counts[p] * d {
                return Err(ExecError::Invalid(format!(
                    "worker {p} sent {} values for {} rows of width {d}",
                    rows.len(),
                    hop.remote_counts[p]
                )));
            }
            src.extend_from_slice(rows);
        }
        if let Some(s) = &scales {
            scale_rows(&mut src, d, &s[h]);
        }
        let x = be.upload_owned(Tensor::new(own_rows + hop.remote_rows(), d, src))?;
        let y = model.forward_layer(i, block, x, mode, Some(&batch.owned))?;
        if i + 1 == layers {
            logits = Some(y);
        } else {
            own = be.download(&y)?;
        }
    }
    let logits = logits.expect("a model has at least one layer");
    let (ce, correct) = be.loss_and_accuracy(&logits, &batch.labels)?;
    let labelled = ce.count;
    // The step's labelled count weights this worker's mean-loss gradient.
    let mut sums = [
        ce.loss as f64 * labelled as f64,
        labelled as f64,
        correct as f64,
    ];
    let t = Instant::now();
    comm.all_reduce_sum_f64(&mut sums)?;
    comm_s += t.elapsed().as_secs_f64();
    let step_labelled = sums[1] as usize;
    out.mine = BatchOutcome {
        loss: ce.loss as f64,
        correct,
        labelled,
    };
    out.step = BatchOutcome {
        loss: if step_labelled > 0 {
            sums[0] / sums[1]
        } else {
            0.0
        },
        correct: sums[2] as usize,
        labelled: step_labelled,
    };
    let mut g = ce.grad;
    be.scale(
        &mut g,
        if step_labelled > 0 {
            labelled as f32 / step_labelled as f32
        } else {
            0.0
        },
    )?;
    model.zero_grad()?;
    for i in (0..layers).rev() {
        let Some(dx) = model.backward_layer(i, g, i > 0)? else {
            break;
        };
        // Gradients of the rows read from other workers go back to their owners, who add them
        // to their own rows' gradients (in rank order, so the sum is deterministic).
        let h = layers - 1 - i;
        let hop = &batch.hops[h];
        let own_rows = batch.reach[h + 1];
        let mut dx = be.download(&dx)?;
        let d = dx.cols();
        if let Some(s) = &scales {
            scale_rows(dx.data_mut(), d, &s[h]);
        }
        let mut at = own_rows;
        let send: Vec<Vec<f32>> = hop
            .remote_counts
            .iter()
            .map(|&n| {
                let rows = dx.data()[at * d..(at + n) * d].to_vec();
                at += n;
                rows
            })
            .collect();
        out.shuffled_bytes += send.iter().map(|s| 4 * s.len() as u64).sum::<u64>();
        let t = Instant::now();
        let got = comm.all_to_all_v_f32(&send)?;
        comm_s += t.elapsed().as_secs_f64();
        let mut mine = dx.data()[..own_rows * d].to_vec();
        for (p, rows) in got.iter().enumerate() {
            let groups = hop.serve_groups.as_ref().map(|g| &g[p]);
            let expected = groups.map_or(hop.serve[p].len(), |g| g.len().saturating_sub(1));
            if rows.len() != expected * d {
                return Err(ExecError::Invalid(format!(
                    "worker {p} sent {} gradient values for {expected} rows of width {d}",
                    rows.len(),
                )));
            }
            // A row's gradient goes to each vertex it was made of, times that vertex's
            // coefficient in it (1 for a plain row).
            for (j, row) in rows.chunks_exact(d.max(1)).enumerate() {
                let (lo, hi) = groups.map_or((j, j + 1), |g| (g[j] as usize, g[j + 1] as usize));
                for m in lo..hi {
                    let r = hop.serve[p][m] as usize;
                    let c = if groups.is_some() {
                        coeffs[h][p][m]
                    } else {
                        1.0
                    };
                    mine[r * d..(r + 1) * d]
                        .iter_mut()
                        .zip(row)
                        .for_each(|(a, b)| *a += c * b);
                }
            }
        }
        g = be.upload_owned(Tensor::new(own_rows, d, mine))?;
    }
    out.shuffle_s = comm_s;
    // One worker holds the whole gradient already: nothing to sum, nothing to time.
    if comm.size() > 1 {
        let t = Instant::now();
        let mut grads = Vec::new();
        trainer.gradients_into(1.0, &mut grads)?;
        comm.all_reduce_sum_f32(&mut grads)?;
        out.allreduce_bytes = 4 * grads.len() as u64;
        trainer.set_gradients(&grads, 1.0)?;
        out.allreduce_s = t.elapsed().as_secs_f64();
    }
    Ok(out)
}

/// Multiplies row `r` of the row-major `rows` (width `d`) by `scale[r]`.
fn scale_rows(rows: &mut [f32], d: usize, scale: &[f32]) {
    for (row, &c) in rows.chunks_exact_mut(d.max(1)).zip(scale) {
        row.iter_mut().for_each(|x| *x *= c);
    }
}

/// For every hop, the factor of each local source row that turns GCN's normalisation by the
/// source's out-degree in this worker's block into its out-degree in the whole step's block:
/// `sqrt(max(local, 1) / max(global, 1))`. Owners sum the degrees the other workers report for
/// their rows, then send the totals back along the rows' forward route.
fn gcn_source_scales(batch: &SplitBatch, comm: &dyn Comm) -> Result<Vec<Vec<f32>>> {
    let mut out = Vec::with_capacity(batch.hops.len());
    for (h, hop) in batch.hops.iter().enumerate() {
        let own_rows = batch.reach[h + 1];
        let mut local = vec![0f32; own_rows + hop.remote_rows()];
        for &s in &hop.indices {
            local[s as usize] += 1.0;
        }
        let mut at = own_rows;
        let send: Vec<Vec<f32>> = hop
            .remote_counts
            .iter()
            .map(|&n| {
                at += n;
                local[at - n..at].to_vec()
            })
            .collect();
        let got = comm.all_to_all_v_f32(&send)?;
        let mut global = local[..own_rows].to_vec();
        for (p, degs) in got.iter().enumerate() {
            if degs.len() != hop.serve[p].len() {
                return Err(ExecError::Invalid(format!(
                    "worker {p} sent {} degrees for {} rows",
                    degs.len(),
                    hop.serve[p].len()
                )));
            }
            for (&r, &k) in hop.serve[p].iter().zip(degs) {
                global[r as usize] += k;
            }
        }
        let back: Vec<Vec<f32>> = hop
            .serve
            .iter()
            .map(|rows| rows.iter().map(|&r| global[r as usize]).collect())
            .collect();
        let got = comm.all_to_all_v_f32(&back)?;
        for (p, degs) in got.iter().enumerate() {
            if degs.len() != hop.remote_counts[p] {
                return Err(ExecError::Invalid(format!(
                    "worker {p} sent {} degrees for {} rows",
                    degs.len(),
                    hop.remote_counts[p]
                )));
            }
            global.extend_from_slice(degs);
        }
        let scale = local
            .iter()
            .zip(&global)
            .map(|(&l, &g)| (l.max(1.0) / g.max(1.0)).sqrt())
            .collect();
        out.push(scale);
    }
    Ok(out)
}

/// The partial sums one peer reads: group `j` is the members `serve[groups[j]..groups[j + 1]]`
/// (positions of rows of `own`), each times its coefficient.
fn partial_sums(own: &Tensor, serve: &[u32], groups: &[u32], coeff: &[f32]) -> Vec<f32> {
    let d = own.cols();
    let mut out = vec![0f32; groups.len().saturating_sub(1) * d];
    for (j, row) in out.chunks_exact_mut(d.max(1)).enumerate() {
        for m in groups[j] as usize..groups[j + 1] as usize {
            let c = coeff[m];
            row.iter_mut()
                .zip(own.row(serve[m] as usize))
                .for_each(|(a, &x)| *a += c * x);
        }
    }
    out
}

/// For every peer, the coefficient of each member of the partial sums this worker sends it at
/// this hop (empty for plain rows): the sum of `k` members stands for `k` parallel edges, so
/// mean and sum layers need `1 / k`; GCN, which divides by the source's degree in the
/// receiving block (`k`), needs `1 / sqrt(k * global degree)`, the global degree being the
/// member's edges in this worker's own block plus its memberships in every peer's sums.
fn member_coefficients(hop: &SplitHop, own_rows: usize, gcn: bool) -> Vec<Vec<f32>> {
    let Some(groups) = &hop.serve_groups else {
        return vec![Vec::new(); hop.serve.len()];
    };
    let degree = gcn.then(|| own_global_degrees(hop, own_rows));
    groups
        .iter()
        .zip(&hop.serve)
        .map(|(g, members)| {
            let mut c = vec![0f32; members.len()];
            for w in g.windows(2) {
                let k = (w[1] - w[0]) as f32;
                for m in w[0] as usize..w[1] as usize {
                    c[m] = match &degree {
                        None => 1.0 / k,
                        Some(deg) => 1.0 / (k * deg[members[m] as usize].max(1.0)).sqrt(),
                    };
                }
            }
            c
        })
        .collect()
}

/// With partial sums, every edge out of this worker's vertices is visible here: in its own
/// block, or as a membership in a peer's sum. Their count per own row is the vertex's
/// out-degree in the whole step's block.
fn own_global_degrees(hop: &SplitHop, own_rows: usize) -> Vec<f32> {
    let mut deg = vec![0f32; own_rows];
    for &s in &hop.indices {
        if (s as usize) < own_rows {
            deg[s as usize] += 1.0;
        }
    }
    for &r in hop.serve.iter().flatten() {
        deg[r as usize] += 1.0;
    }
    deg
}

/// GCN with partial sums: the factor of each local source row of every hop. Own rows take
/// `sqrt(local / global degree)` as in [`gcn_source_scales`]; the peers' rows are already
/// scaled by their senders ([`member_coefficients`]), so theirs is 1.
fn gcn_partial_scales(batch: &SplitBatch) -> Vec<Vec<f32>> {
    batch
        .hops
        .iter()
        .enumerate()
        .map(|(h, hop)| {
            let own_rows = batch.reach[h + 1];
            let global = own_global_degrees(hop, own_rows);
            let mut local = vec![0f32; own_rows];
            for &s in &hop.indices {
                if (s as usize) < own_rows {
                    local[s as usize] += 1.0;
                }
            }
            let mut scale: Vec<f32> = local
                .iter()
                .zip(&global)
                .map(|(&l, &g)| (l.max(1.0) / g.max(1.0)).sqrt())
                .collect();
            scale.resize(own_rows + hop.remote_rows(), 1.0);
            scale
        })
        .collect()
}
