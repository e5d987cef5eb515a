//! The first layer's input aggregated where the features are stored (`Prepared::input_agg`)
//! against the plain path it replaces: the same aggregate bit for bit, the same training, and
//! fewer rows written.

use fanout_compute::{Backend, CpuBackend, Model, ModelConfig, ModelKind, RowSource, Tensor};
use fanout_exec::{block_refs, train, Pipeline, PipelineConfig, RunEnv, StrategyKind, TrainConfig};
use fanout_graph::{Dataset, FeatDtype};
use fanout_sample::{KHopConfig, KHopSampler, RemapKind, Sampler};
use std::sync::Arc;

mod common;
use common::{saved_tiny, saved_tiny_as};

fn pipeline(ds: &Arc<Dataset>, plan: Option<fanout_compute::InputPlan>) -> Pipeline {
    pipeline_in(ds, plan, false)
}

fn pipeline_in(
    ds: &Arc<Dataset>,
    plan: Option<fanout_compute::InputPlan>,
    in_trainer: bool,
) -> Pipeline {
    let cfg = KHopConfig {
        fanouts: vec![3, 3],
        replace: false,
        remap: RemapKind::Auto,
    };
    let s: Arc<dyn Sampler> = Arc::new(KHopSampler::new(ds.clone(), cfg).unwrap());
    let ex = fanout_cache::PlainExtractor::new(ds.clone()).unwrap();
    let pc = PipelineConfig {
        batch_size: 16,
        seed: 3,
        input_plan: plan,
        aggregate_in_trainer: in_trainer,
        ..PipelineConfig::default()
    };
    Pipeline::new(s, Box::new(ex), ds.train.to_vec(), &pc).unwrap()
}

#[test]
fn the_extract_stage_aggregate_equals_the_layer_aggregate_of_the_gathered_rows() {
    let (_dir, ds) = saved_tiny(700);
    for kind in [ModelKind::Sage, ModelKind::Gcn, ModelKind::Gin] {
        aggregates_equal(&ds, kind);
    }
    // f16 storage: converted row by row as it is aggregated, to the gathered rows' bits.
    let (_dir16, ds16) = saved_tiny_as(700, FeatDtype::F16);
    for kind in [ModelKind::Sage, ModelKind::Gcn] {
        aggregates_equal(&ds16, kind);
    }
    // Models that project every source row first have no plan.
    let dim = ds.features.as_ref().unwrap().dim;
    for kind in [ModelKind::Gat, ModelKind::PinSage] {
        let mc = ModelConfig::new(kind, dim, 16, ds.meta.num_class as usize, 2);
        assert!(Model::new(CpuBackend, mc).unwrap().input_plan().is_none());
    }
}

fn aggregates_equal(ds: &Arc<Dataset>, kind: ModelKind) {
    let dim = ds.features.as_ref().unwrap().dim;
    let model = Model::new(
        CpuBackend,
        ModelConfig::new(kind, dim, 16, ds.meta.num_class as usize, 2),
    )
    .unwrap();
    let plan = model.input_plan().expect("aggregates its input first");
    let (fused, plain) = (pipeline(ds, Some(plan)), pipeline(ds, None));
    let mut batches = 0;
    for (f, p) in fused.epoch(0).zip(plain.epoch(0)) {
        let (f, p) = (f.unwrap(), p.unwrap());
        assert_eq!(f.batch, p.batch, "the same batches");
        assert!(p.input_agg.is_none());
        let agg = f.input_agg.expect("aggregated in the extract stage");
        let b0 = &p.batch.blocks[0];
        // The destinations' rows: a prefix of the gathered matrix.
        assert_eq!(f.features, p.features[..b0.num_dst * dim]);
        // The aggregate: what the layer computes from the whole gathered matrix.
        let be = CpuBackend;
        let block = be.prepare_block(&block_refs(&p.batch.blocks)[0]).unwrap();
        let coeff = be.edge_coefficients(&block, plan.aggregation).unwrap();
        let x = Tensor::new(p.batch.input_nodes.len(), dim, p.features);
        let want = be.spmm(&block, coeff.as_ref(), &x).unwrap();
        assert_eq!(agg, want.data(), "bit for bit");
        // Rows written: the destinations' and their aggregate, not every source row (fewer
        // wherever a block's sources outnumber twice its destinations, as here).
        assert_eq!(f.features.len() + agg.len(), 2 * b0.num_dst * dim);
        assert!(2 * b0.num_dst < b0.num_src, "{} {}", b0.num_dst, b0.num_src);
        // Rows read: the destinations' and one per edge.
        assert_eq!(f.extract.rows, (b0.num_dst + b0.num_edges()) as u64);
        batches += 1;
    }
    assert_eq!(batches, fused.num_batches());
}

/// Left to the trainer (`aggregate_in_trainer`), the aggregate the store names is the one the
/// extract stage makes, bit for bit, the batch brings only the destinations' rows and the same
/// stats, and the model's logits through it are those through the made aggregate.
#[test]
fn the_aggregate_left_to_the_trainer_equals_the_extract_stage_aggregate() {
    let (_dir, ds) = saved_tiny(700);
    let dim = ds.features.as_ref().unwrap().dim;
    for kind in [ModelKind::Sage, ModelKind::Gcn] {
        let mut model = Model::new(
            CpuBackend,
            ModelConfig::new(kind, dim, 16, ds.meta.num_class as usize, 2),
        )
        .unwrap();
        let plan = model.input_plan().expect("aggregates its input first");
        let (left, made) = (
            pipeline_in(&ds, Some(plan), true),
            pipeline(&ds, Some(plan)),
        );
        let mut left_to_trainer = 0;
        for (l, m) in left.epoch(0).zip(made.epoch(0)) {
            let (l, m) = (l.unwrap(), m.unwrap());
            assert_eq!(l.batch, m.batch, "the same batches");
            if plan.reads_dst {
                assert_eq!(l.features, m.features, "the destinations' rows");
                assert_eq!(l.extract, m.extract, "the same rows read");
            } else {
                // GCN reads only the aggregate: its destinations' rows are not gathered.
                let num_dst = l.batch.blocks[0].num_dst as u64;
                assert!(l.features.is_empty(), "{kind:?}: destination rows gathered");
                assert_eq!(l.extract.rows + num_dst, m.extract.rows, "{kind:?}");
                let row_bytes = (dim * std::mem::size_of::<f32>()) as u64;
                assert_eq!(
                    l.extract.bytes_total + num_dst * row_bytes,
                    m.extract.bytes_total,
                    "{kind:?}"
                );
                assert_eq!(l.extract.bytes_from_host, l.extract.bytes_total);
            }
            let agg = m.input_agg.expect("aggregated in the extract stage");
            let Some(store) = l.input_store.as_ref() else {
                assert!(l.input_agg.is_some(), "one or the other");
                continue;
            };
            left_to_trainer += 1;
            let src = store.rows_of(&l.batch).unwrap();
            let (rows, cols) = (src.rows(), src.cols());
            let mut got = Vec::with_capacity(rows * cols);
            // In two ranges, as the product asks for them.
            let half = rows / 2;
            src.fill(0..half, &mut got.spare_capacity_mut()[..half * cols]);
            src.fill(
                half..rows,
                &mut got.spare_capacity_mut()[half * cols..rows * cols],
            );
            // SAFETY: `fill` wrote every element of both ranges.
            unsafe { got.set_len(rows * cols) };
            assert!(
                got.iter()
                    .zip(&agg)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{kind:?}: the aggregate bit for bit"
            );
            // The logits through the sourced forward and through the made aggregate.
            let be = CpuBackend;
            let blocks: Vec<_> = block_refs(&l.batch.blocks)
                .iter()
                .map(|b| be.prepare_block(b).unwrap())
                .collect();
            let rows_of = |f: &Vec<f32>| Tensor::new(f.len() / dim, dim, f.clone());
            let mode = fanout_compute::Mode::Eval;
            let sourced = model
                .forward_rows_sourced(&blocks, rows_of(&l.features), &src, mode, None)
                .unwrap();
            let a = Tensor::new(rows, dim, agg);
            let plain = model
                .forward_rows_aggregated(&blocks, rows_of(&m.features), a, mode, None)
                .unwrap();
            assert!(
                sourced
                    .data()
                    .iter()
                    .zip(plain.data())
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{kind:?}: the logits bit for bit"
            );
        }
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            assert!(
                left_to_trainer > 0,
                "{kind:?}: no batch left its aggregate to the trainer"
            );
        }
    }
}

fn config(ds: &Dataset, model: ModelKind, fuse: bool, workers: usize) -> TrainConfig {
    TrainConfig {
        dataset: Some(ds.dir.clone()),
        model,
        fanouts: Some(vec![4, 3]),
        batch_size: Some(48),
        hidden: Some(16),
        epochs: 3,
        lr: Some(0.01),
        threads: Some(1),
        workers,
        seed: 5,
        fuse_input: fuse,
        strategy: Some(if workers > 1 {
            StrategyKind::DataParallel
        } else {
            StrategyKind::Single
        }),
        ..TrainConfig::default()
    }
}

#[test]
fn training_with_the_fused_input_equals_training_without() {
    let (_dir, ds32) = saved_tiny(700);
    let (_dir16, ds16) = saved_tiny_as(700, FeatDtype::F16);
    for (model, workers, ds) in [
        (ModelKind::Sage, 1, &ds32),
        (ModelKind::Sage, 2, &ds32),
        (ModelKind::Gcn, 1, &ds32),
        (ModelKind::Gin, 1, &ds32),
        (ModelKind::Gin, 2, &ds32),
        (ModelKind::Sage, 1, &ds16),
    ] {
        let run = |fuse| {
            let cfg = config(ds, model, fuse, workers);
            train(&cfg, &RunEnv::default(), &mut ()).unwrap()
        };
        let (fused, plain) = (run(true), run(false));
        for (a, b) in fused.metrics.epochs.iter().zip(&plain.metrics.epochs) {
            assert_eq!(
                a.loss, b.loss,
                "{model:?} {workers} workers, epoch {}",
                a.epoch
            );
            assert_eq!(a.train_acc, b.train_acc);
            // The plain run read each input row once; the fused one each destination's row
            // and one per edge of block 0, so it did take the fused path.
            assert_eq!(b.extract.rows, b.input_nodes);
            assert_ne!(
                a.extract.rows, b.extract.rows,
                "{model:?} {workers} workers"
            );
        }
        assert_eq!(fused.metrics.test_acc, plain.metrics.test_acc);
        for ((_, a), (_, b)) in fused
            .model
            .named_params()
            .iter()
            .zip(plain.model.named_params().iter())
        {
            assert_eq!(
                a.value.data(),
                b.value.data(),
                "{model:?} {workers} workers"
            );
        }
    }
}
