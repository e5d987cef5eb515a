//! Safetensors checkpoints: round trips and the errors of mismatched files.

mod common;

use std::collections::HashMap;

use common::{rand_tensor, OwnedBlock};
use fanout_compute::io::{self, CONFIG_KEY, FORMAT, FORMAT_KEY};
use fanout_compute::{
    Adam, Backend, ComputeError, CpuBackend, Mode, Model, ModelConfig, ModelKind, Optimizer,
};
use fanout_rand::Rng;
use safetensors::tensor::{Dtype, TensorView};

const BE: CpuBackend = CpuBackend;

const KINDS: [ModelKind; 5] = ModelKind::ALL;

/// A 3-layer model of `kind` after one training step (so no parameter is at its init).
fn trained_model(kind: ModelKind, rng: &mut Rng) -> (Model<CpuBackend>, Vec<OwnedBlock>) {
    let mut cfg = ModelConfig::new(kind, 6, 8, 3, 3);
    cfg.heads = 2;
    cfg.seed = 5;
    let mut model = Model::new(BE, cfg).unwrap();
    let owned = vec![
        OwnedBlock::random(9, 14, 3, true, rng),
        OwnedBlock::random(6, 9, 3, true, rng),
        OwnedBlock::random(4, 6, 3, true, rng),
    ];
    let blocks: Vec<_> = owned.iter().map(OwnedBlock::prepare).collect();
    let x = rand_tensor(14, 6, rng);
    let logits = model
        .forward(&blocks, x, Mode::Train { dropout_key: 1 })
        .unwrap();
    let ce = BE.softmax_cross_entropy(&logits, &[0, 1, 2, -1]).unwrap();
    model.backward(&ce.grad).unwrap();
    Adam::new(BE, 0.01).step_model(&mut model).unwrap();
    (model, owned)
}

#[test]
fn save_load_round_trip_gives_identical_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng::new(1);
    for kind in KINDS {
        let (mut model, owned) = trained_model(kind, &mut rng);
        let path = dir.path().join(format!("{}.safetensors", kind.name()));
        io::save(&model, &path).unwrap();
        let mut loaded = io::load(BE, &path).unwrap();
        assert_eq!(loaded.config(), model.config());
        for ((na, pa), (nb, pb)) in model.named_params().iter().zip(loaded.named_params()) {
            assert_eq!(na, &nb);
            assert_eq!(pa.value, pb.value, "{na}");
        }
        let blocks: Vec<_> = owned.iter().map(OwnedBlock::prepare).collect();
        let x = rand_tensor(14, 6, &mut rng);
        let a = model.forward(&blocks, x.clone(), Mode::Eval).unwrap();
        let b = loaded.forward(&blocks, x, Mode::Eval).unwrap();
        assert_eq!(a, b, "{kind:?} outputs differ after load");
    }
}

/// Writes a safetensors file with the given tensors and metadata.
fn write(tensors: &[(String, Vec<usize>, Vec<f32>)], meta: HashMap<String, String>) -> Vec<u8> {
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, _, d)| d.iter().flat_map(|v| v.to_le_bytes()).collect())
        .collect();
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .zip(&bytes)
        .map(|((n, s, _), b)| {
            (
                n.clone(),
                TensorView::new(Dtype::F32, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize(views, &Some(meta)).unwrap()
}

fn fanout_meta(cfg: &ModelConfig) -> HashMap<String, String> {
    HashMap::from([
        (FORMAT_KEY.to_string(), FORMAT.to_string()),
        (CONFIG_KEY.to_string(), serde_json::to_string(cfg).unwrap()),
    ])
}

fn expect_format_error(bytes: &[u8], needle: &str) {
    match io::from_bytes(BE, bytes) {
        Err(ComputeError::Format(m)) => assert!(m.contains(needle), "{m:?} lacks {needle:?}"),
        Err(e) => panic!("expected a format error mentioning {needle:?}, got {e}"),
        Ok(_) => panic!("expected a format error mentioning {needle:?}"),
    }
}

#[test]
fn load_rejects_mismatched_files_with_clear_errors() {
    let cfg = ModelConfig::new(ModelKind::Gcn, 4, 5, 3, 2);
    let model = Model::new(BE, cfg.clone()).unwrap();
    let good: Vec<(String, Vec<usize>, Vec<f32>)> = model
        .named_params()
        .into_iter()
        .map(|(n, p)| {
            (
                n,
                vec![p.value.rows(), p.value.cols()],
                p.value.data().to_vec(),
            )
        })
        .collect();
    assert!(io::from_bytes(BE, &write(&good, fanout_meta(&cfg))).is_ok());

    let mut wrong_shape = good.clone();
    wrong_shape[0].1 = vec![5, 4];
    expect_format_error(&write(&wrong_shape, fanout_meta(&cfg)), "layers.0.weight");

    let missing = good[1..].to_vec();
    expect_format_error(
        &write(&missing, fanout_meta(&cfg)),
        "missing tensor layers.0.weight",
    );

    let mut extra = good.clone();
    extra.push(("layers.9.w".to_string(), vec![1, 1], vec![0.0]));
    expect_format_error(
        &write(&extra, fanout_meta(&cfg)),
        "unexpected tensor layers.9.w",
    );

    expect_format_error(&write(&good, HashMap::new()), "not a fanout checkpoint");

    let mut other = fanout_meta(&cfg);
    other.insert(FORMAT_KEY.to_string(), "fanout-model/99".to_string());
    expect_format_error(&write(&good, other), "fanout-model/99");

    let mut broken = fanout_meta(&cfg);
    broken.insert(CONFIG_KEY.to_string(), "{\"kind\":\"gcn\"}".to_string());
    expect_format_error(&write(&good, broken), CONFIG_KEY);

    expect_format_error(b"definitely not safetensors", "not a safetensors file");

    // A configuration that cannot be built is reported as such.
    let mut zero_layers = cfg;
    zero_layers.num_layers = 0;
    assert!(matches!(
        io::from_bytes(BE, &write(&[], fanout_meta(&zero_layers))),
        Err(ComputeError::Config(_))
    ));

    let missing_file = std::path::Path::new("/nonexistent/fanout/model.safetensors");
    assert!(matches!(
        io::load(BE, missing_file),
        Err(ComputeError::Io { .. })
    ));
}

#[test]
fn extra_metadata_round_trips_and_reserved_keys_are_refused() {
    let mut rng = Rng::keyed(&[77]);
    let (model, _) = trained_model(ModelKind::Sage, &mut rng);
    let extra = vec![("train.fanouts".to_string(), "10,25".to_string())];
    let bytes = io::to_bytes_with(&model, &extra).unwrap();
    let meta = io::read_metadata(&bytes).unwrap();
    assert_eq!(meta.get("train.fanouts").map(String::as_str), Some("10,25"));
    assert_eq!(meta.get(FORMAT_KEY).map(String::as_str), Some(FORMAT));
    let back = io::from_bytes(BE, &bytes).unwrap();
    assert_eq!(back.config(), model.config());
    let t = tempfile::tempdir().unwrap();
    let p = t.path().join("m.safetensors");
    io::save_bytes(&bytes, &p).unwrap();
    assert_eq!(std::fs::read(&p).unwrap(), bytes);
    let bad = vec![(CONFIG_KEY.to_string(), "{}".to_string())];
    assert!(matches!(
        io::to_bytes_with(&model, &bad),
        Err(ComputeError::Format(_))
    ));
    // upload_owned gives what upload gives.
    let x = rand_tensor(3, 4, &mut rng);
    assert_eq!(
        BE.upload_owned(x.clone()).unwrap().data(),
        BE.upload(&x).unwrap().data()
    );
}

/// The named parameters of `model` as `write` takes them.
fn tensors_of(model: &Model<CpuBackend>) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    model
        .named_params()
        .into_iter()
        .map(|(n, p)| {
            (
                n,
                vec![p.value.rows(), p.value.cols()],
                p.value.data().to_vec(),
            )
        })
        .collect()
}

#[test]
fn every_kind_and_depth_round_trips_past_the_width_check() {
    // hidden wider than every other width, and one-layer models whose hidden sizes nothing.
    for kind in KINDS {
        for layers in [1, 2] {
            let cfg = ModelConfig::new(kind, 3, 16, 2, layers);
            let model = Model::new(BE, cfg).unwrap();
            let bytes = io::to_bytes(&model).unwrap();
            let back = io::from_bytes(BE, &bytes)
                .unwrap_or_else(|e| panic!("{kind:?} with {layers} layers: {e}"));
            assert_eq!(back.config(), model.config());
        }
    }
}

#[test]
fn damaged_checkpoints_are_format_errors_not_panics() {
    let cfg = ModelConfig::new(ModelKind::Sage, 4, 6, 3, 2);
    let model = Model::new(BE, cfg.clone()).unwrap();
    let good = tensors_of(&model);
    let bytes = write(&good, fanout_meta(&cfg));

    // Truncated: at every cut, never a panic, always a format error.
    for cut in [0, 7, 8, 20, bytes.len() / 2, bytes.len() - 1] {
        expect_format_error(&bytes[..cut], "safetensors");
    }
    // Huge widths in the configuration are refused before anything is allocated.
    for (field, set) in [
        (
            "in_dim",
            (|c: &mut ModelConfig| c.in_dim = 1 << 40) as fn(&mut ModelConfig),
        ),
        ("hidden", |c| c.hidden = 1 << 40),
        ("num_classes", |c| c.num_classes = usize::MAX / 2),
        ("num_layers", |c| c.num_layers = 1 << 30),
    ] {
        let mut huge = cfg.clone();
        set(&mut huge);
        expect_format_error(&write(&good, fanout_meta(&huge)), field);
    }
    // A width that fits but differs from the tensors: the shape check names the tensor.
    let mut narrower = cfg.clone();
    narrower.in_dim = 3;
    expect_format_error(
        &write(&good, fanout_meta(&narrower)),
        "tensor layers.0.w_self has shape [4, 6], expected [3, 6]",
    );
    // A bad value in the configuration: named with the field.
    let mut bad_dropout = serde_json::to_value(&cfg).unwrap();
    bad_dropout["dropout"] = serde_json::json!(1.5);
    let mut meta = fanout_meta(&cfg);
    meta.insert(CONFIG_KEY.to_string(), bad_dropout.to_string());
    match io::from_bytes(BE, &write(&good, meta)) {
        Err(ComputeError::Config(m)) => assert!(m.contains("dropout"), "{m}"),
        Err(e) => panic!("expected a configuration error, got {e}"),
        Ok(_) => panic!("dropout 1.5 accepted"),
    }
    let mut meta = fanout_meta(&cfg);
    meta.insert(
        CONFIG_KEY.to_string(),
        bad_dropout
            .to_string()
            .replace("\"sage\"", "\"transformer\""),
    );
    expect_format_error(&write(&good, meta), "transformer");
    // A tensor stored with another dtype.
    let b: Vec<u8> = vec![0; 4 * 6 * 8];
    let mut views: Vec<(String, TensorView<'_>)> = Vec::new();
    let raw: Vec<Vec<u8>> = good
        .iter()
        .map(|(_, _, d)| d.iter().flat_map(|v| v.to_le_bytes()).collect())
        .collect();
    for ((n, s, _), r) in good.iter().zip(&raw) {
        let view = if n == "layers.0.w_self" {
            TensorView::new(Dtype::F64, s.clone(), &b).unwrap()
        } else {
            TensorView::new(Dtype::F32, s.clone(), r).unwrap()
        };
        views.push((n.clone(), view));
    }
    let f64_bytes = safetensors::serialize(views, &Some(fanout_meta(&cfg))).unwrap();
    expect_format_error(&f64_bytes, "dtype F64, expected F32");
    // Trainer-state tensors are ignored by the model loader and read one by one, checked.
    let mut with_state = good.clone();
    with_state.push(("train.optim.0".to_string(), vec![2, 2], vec![1.0; 4]));
    let st = write(&with_state, fanout_meta(&cfg));
    assert!(io::from_bytes(BE, &st).is_ok());
    assert_eq!(
        io::read_tensor(&st, "train.optim.0", 2, 2).unwrap().data(),
        &[1.0; 4]
    );
    assert!(
        matches!(io::read_tensor(&st, "train.optim.0", 4, 1), Err(ComputeError::Format(m)) if m.contains("[4, 1]"))
    );
    assert!(
        matches!(io::read_tensor(&st, "train.optim.1", 2, 2), Err(ComputeError::Format(m)) if m.contains("missing tensor train.optim.1"))
    );
}

#[test]
fn optimiser_state_exported_and_imported_continues_exactly() {
    let mut rng = Rng::keyed(&[78]);
    let (mut a, owned) = trained_model(ModelKind::Sage, &mut rng);
    let blocks: Vec<_> = owned.iter().map(OwnedBlock::prepare).collect();
    let x = rand_tensor(14, 6, &mut rng);
    let grad_step = |m: &mut Model<CpuBackend>, opt: &mut dyn Optimizer<CpuBackend>| {
        let logits = m
            .forward(&blocks, x.clone(), Mode::Train { dropout_key: 3 })
            .unwrap();
        let ce = BE.softmax_cross_entropy(&logits, &[0, 1, 2, -1]).unwrap();
        m.zero_grad().unwrap();
        m.backward(&ce.grad).unwrap();
        opt.step_model(m).unwrap();
    };
    let mut b = io::from_bytes(BE, &io::to_bytes(&a).unwrap()).unwrap();
    let mut opt_a = Adam::new(BE, 0.01);
    grad_step(&mut a, &mut opt_a);
    // b continues from a's exported state after the same first step.
    grad_step(&mut b, &mut Adam::new(BE, 0.01));
    let state = opt_a.export_state().unwrap();
    assert_eq!(state.step, 1);
    assert_eq!(state.tensors.len(), 2 * a.named_params().len());
    let mut opt_b = Adam::new(BE, 0.01);
    opt_b.import_state(state.clone()).unwrap();
    for _ in 0..3 {
        grad_step(&mut a, &mut opt_a);
        grad_step(&mut b, &mut opt_b);
    }
    let values = |m: &Model<CpuBackend>| tensors_of(m);
    assert_eq!(values(&a), values(&b));
    // Without the state, the continuation differs (the test can fail).
    let mut c = io::from_bytes(BE, &io::to_bytes(&b).unwrap()).unwrap();
    let mut d = io::from_bytes(BE, &io::to_bytes(&b).unwrap()).unwrap();
    grad_step(&mut c, &mut opt_b);
    grad_step(&mut d, &mut Adam::new(BE, 0.01));
    assert_ne!(values(&c), values(&d));
    let mut odd = state;
    odd.tensors.pop();
    assert!(Adam::new(BE, 0.01).import_state(odd).is_err());
}
