//! Block 0's aggregate made by the trainer from the stored rows
//! ([`crate::pipeline::PipelineConfig::aggregate_in_trainer`]).

use std::mem::MaybeUninit;
use std::ops::Range;
use std::sync::Arc;

use fanout_compute::RowSource;
use fanout_graph::{Dataset, Features};
use fanout_sample::MiniBatch;

use crate::error::{ExecError, Result};

/// Where a trainer reads block 0's aggregate from ([`crate::pipeline::Prepared::input_store`]).
#[derive(Clone)]
pub struct StoreInput {
    /// The dataset whose stored rows are aggregated.
    pub store: Arc<Dataset>,
    /// The aggregation's edge coefficients (block 0's edges; `None`: a plain sum), those the
    /// first layer computes itself.
    pub coeff: Option<Vec<f32>>,
}

impl std::fmt::Debug for StoreInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreInput")
            .field("store", &self.store.dir)
            .field("edges", &self.coeff.as_ref().map(Vec::len))
            .finish()
    }
}

impl StoreInput {
    /// Block 0's aggregate over `batch` as a [`RowSource`]: row `d` is what
    /// [`Features::aggregate_into`] makes for destination `d`. `Err` when the store has no
    /// features, the batch has no block, or the coefficients do not match its edges.
    pub fn rows_of<'a>(&'a self, batch: &'a MiniBatch) -> Result<StoreAggregate<'a>> {
        let features = self.store.features.as_ref().ok_or_else(|| {
            ExecError::Invalid(format!(
                "{}: block 0's aggregate asked of a dataset without features",
                self.store.dir.display()
            ))
        })?;
        let b0 = batch.blocks.first().ok_or_else(|| {
            ExecError::Invalid("block 0's aggregate asked of a batch without blocks".into())
        })?;
        let edges = b0.indices.len();
        if self.coeff.as_ref().is_some_and(|c| c.len() != edges)
            || b0.indptr.len() != b0.num_dst + 1
            || b0.indptr.last().is_some_and(|&e| e as usize != edges)
        {
            return Err(ExecError::Invalid(format!(
                "block 0's aggregate: {} coefficients and {} offsets for {} destinations and \
                 {edges} edges",
                self.coeff.as_ref().map_or(0, Vec::len),
                b0.indptr.len(),
                b0.num_dst
            )));
        }
        Ok(StoreAggregate {
            features,
            ids: &batch.input_nodes,
            indptr: &b0.indptr,
            indices: &b0.indices,
            coeff: self.coeff.as_deref(),
            rows: b0.num_dst,
        })
    }
}

/// Block 0's aggregate, made from the stored rows on request ([`StoreInput::rows_of`]).
pub struct StoreAggregate<'a> {
    features: &'a Features,
    ids: &'a [u32],
    indptr: &'a [u32],
    indices: &'a [u32],
    coeff: Option<&'a [f32]>,
    rows: usize,
}

impl RowSource for StoreAggregate<'_> {
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.features.dim
    }
    fn fill(&self, rows: Range<usize>, out: &mut [MaybeUninit<f32>]) {
        self.features
            .aggregate_rows(self.ids, self.indptr, self.indices, self.coeff, rows, out);
    }
    fn stored_rows(&self, rows: Range<usize>, out: &mut Vec<usize>) {
        self.features
            .stored_rows(self.ids, self.indptr, self.indices, rows, out);
    }
    fn stored_row_bytes(&self) -> usize {
        self.features.row_bytes()
    }
    fn stored_reads(&self) -> usize {
        self.indices.len()
    }
}
