//! Sampling one mini-batch across the workers of a split run.

use crate::error::{ExecError, Result};
use fanout_comm::Comm;
use fanout_sample::{BatchKey, RangeOwners, Sampler};
use std::collections::HashMap;

/// One worker's share of a step's mini-batch.
///
/// Local ids: this worker's vertices are numbered in the order it reached them (`owned`), so
/// the vertices reached within `h` hops are the prefix `owned[..reach[h]]` (`reach[0]`: its
/// seeds, in the step's order). The block of hop `h` has those as destinations and, as sources,
/// `owned[..reach[h + 1]]` followed by `hops[h].remote` (vertices of other workers).
#[derive(Clone, Debug, PartialEq)]
pub struct SplitBatch {
    /// The key the step was sampled under.
    pub key: BatchKey,
    /// Seeds of the whole step, all workers together.
    pub step_seeds: usize,
    /// The vertices of this worker the step reaches, in the order reached.
    pub owned: Vec<u32>,
    /// `reach[h]`: how many of `owned` are reached within `h` hops (`hops.len() + 1` values).
    pub reach: Vec<usize>,
    /// The blocks, hop 0 (the seeds' own neighbours, the model's last layer) first.
    pub hops: Vec<SplitHop>,
    /// Labels of this worker's seeds (`owned[..reach[0]]`), -1 where unlabelled.
    pub labels: Vec<i64>,
}

/// One hop of a [`SplitBatch`]: its block over local ids and what it exchanges.
#[derive(Clone, Debug, PartialEq)]
pub struct SplitHop {
    /// `reach[h] + 1` offsets into `indices`.
    pub indptr: Vec<u32>,
    /// Local source of every edge: `< reach[h + 1]` for this worker's vertices, above for
    /// `remote`.
    pub indices: Vec<u32>,
    /// Per-edge weights (weighted sampling).
    pub weights: Option<Vec<f32>>,
    /// Sources owned by other workers, grouped by owner in rank order.
    pub remote: Vec<u32>,
    /// How many of `remote` each rank owns (0 for this worker).
    pub remote_counts: Vec<usize>,
    /// For every rank, the positions in `owned` of the rows it reads from this worker at this
    /// hop, in the order of its `remote` (empty for this worker).
    pub serve: Vec<Vec<u32>>,
}

impl SplitHop {
    /// Edges whose source this worker owns, and edges whose source lives elsewhere.
    pub fn local_and_remote_edges(&self, own_rows: usize) -> (u64, u64) {
        let local = self
            .indices
            .iter()
            .filter(|&&s| (s as usize) < own_rows)
            .count() as u64;
        (local, self.indices.len() as u64 - local)
    }
}

/// Samples this worker's share of the mini-batch of `seeds` (the whole step's, the same list on
/// every worker of `comm`) under `key`, exchanging requests with the other workers once per
/// hop. Every worker must call it with the same arguments. The union of the workers' blocks is
/// the one-worker batch of `seeds` under `key`: the same edges, each computed by the owner of
/// its destination. Errors: `owners` not having one part per worker, a vertex beyond its
/// ranges, a sampler that cannot sample one hop at a time, and communication failures.
pub fn sample(
    sampler: &dyn Sampler,
    owners: &RangeOwners,
    seeds: &[u32],
    key: BatchKey,
    comm: &dyn Comm,
) -> Result<SplitBatch> {
    let (rank, size) = (comm.rank(), comm.size());
    if owners.parts() != size {
        return Err(ExecError::Invalid(format!(
            "the partition has {} parts but the run has {size} workers",
            owners.parts()
        )));
    }
    let owner = |v: u32| {
        owners.owner(v as u64).ok_or_else(|| {
            ExecError::Invalid(format!(
                "vertex {v} lies beyond the partition's id ranges; is the partition of this dataset?"
            ))
        })
    };
    let mut owned = Vec::new();
    for &s in seeds {
        if owner(s)? == rank {
            owned.push(s);
        }
    }
    let mut pos: HashMap<u32, u32> = owned
        .iter()
        .enumerate()
        .map(|(i, &v)| (v, i as u32))
        .collect();
    if pos.len() != owned.len() {
        return Err(ExecError::Invalid(
            "the step's seeds repeat a vertex".into(),
        ));
    }
    let mut reach = vec![owned.len()];
    let mut hops = Vec::with_capacity(sampler.num_layers());
    for h in 0..sampler.num_layers() {
        let e = sampler.sample_hop(&owned[..reach[h]], key, h)?;
        // Sources: this worker's new vertices join `owned`; the others are requested from
        // their owners, each once per hop.
        let mut requests: Vec<Vec<u32>> = vec![Vec::new(); size];
        let mut request_at: HashMap<u32, (usize, u32)> = HashMap::new();
        for &u in &e.ids {
            let o = owner(u)?;
            if o == rank {
                if let std::collections::hash_map::Entry::Vacant(slot) = pos.entry(u) {
                    slot.insert(owned.len() as u32);
                    owned.push(u);
                }
            } else {
                request_at.entry(u).or_insert_with(|| {
                    requests[o].push(u);
                    (o, requests[o].len() as u32 - 1)
                });
            }
        }
        let asked = comm.all_to_all_v(&requests.iter().map(|r| encode(r)).collect::<Vec<_>>())?;
        let mut serve = Vec::with_capacity(size);
        for (p, bytes) in asked.iter().enumerate() {
            let ids = decode(bytes, p)?;
            let mut at = Vec::with_capacity(ids.len());
            for u in ids {
                if p == rank || owner(u)? != rank {
                    return Err(ExecError::Invalid(format!(
                        "worker {p} asked worker {rank} for vertex {u}, which it does not own"
                    )));
                }
                let i = *pos.entry(u).or_insert_with(|| {
                    owned.push(u);
                    owned.len() as u32 - 1
                });
                at.push(i);
            }
            serve.push(at);
        }
        reach.push(owned.len());
        let own_rows = owned.len() as u32;
        let mut first = vec![0u32; size];
        for p in 1..size {
            first[p] = first[p - 1] + requests[p - 1].len() as u32;
        }
        let indices = e
            .ids
            .iter()
            .map(|u| match request_at.get(u) {
                Some(&(o, i)) => own_rows + first[o] + i,
                None => pos[u],
            })
            .collect();
        hops.push(SplitHop {
            indptr: e.indptr,
            indices,
            weights: e.weights,
            remote_counts: requests.iter().map(Vec::len).collect(),
            remote: requests.concat(),
            serve,
        });
    }
    let ds = sampler.dataset();
    let labels = match &ds.labels {
        Some(l) => owned[..reach[0]].iter().map(|&v| l[v as usize]).collect(),
        None => vec![-1; reach[0]],
    };
    Ok(SplitBatch {
        key,
        step_seeds: seeds.len(),
        owned,
        reach,
        hops,
        labels,
    })
}

fn encode(ids: &[u32]) -> Vec<u8> {
    ids.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn decode(bytes: &[u8], from: usize) -> Result<Vec<u32>> {
    if !bytes.len().is_multiple_of(4) {
        return Err(ExecError::Invalid(format!(
            "worker {from} sent {} bytes of vertex ids; expected a multiple of 4",
            bytes.len()
        )));
    }
    Ok(bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}
