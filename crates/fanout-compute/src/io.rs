//! Model checkpoints in the safetensors format.
//!
//! Layout: one F32 tensor per parameter, named `layers.{i}.{param}` ([`Model::named_params`]),
//! shape `[rows, cols]` with weights stored `in x out` (the transpose of PyTorch's
//! `nn.Linear.weight`). The safetensors metadata map holds `fanout.format` =
//! [`FORMAT`] and `fanout.config` = the [`ModelConfig`] as JSON, enough to rebuild the model.
//! Loading checks the format tag, the configuration, and that the file has exactly the
//! model's tensor names with the expected dtype and shapes; any mismatch is a
//! [`ComputeError::Format`] naming the tensor. The configuration's widths are checked against
//! the tensors the file holds *before* the model is allocated, so a damaged `fanout.config`
//! (say `in_dim` 10^12) is an error, not an allocation failure.
//!
//! Tensors named with the [`TRAIN_STATE_PREFIX`] belong to a trainer's resumable state (the
//! current parameters and the optimiser's state, see `fanout train --resume`); the model
//! loader ignores them and [`read_tensor`] reads them one by one, validated.

use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::{Dtype, SafeTensors, TensorView};

use crate::backend::Backend;
use crate::error::{ComputeError, Result};
use crate::model::{Model, ModelConfig};
use crate::tensor::Tensor;

/// Value of the `fanout.format` metadata entry written by this version.
pub const FORMAT: &str = "fanout-model/1";
/// Metadata key of the format tag.
pub const FORMAT_KEY: &str = "fanout.format";
/// Metadata key of the JSON model configuration.
pub const CONFIG_KEY: &str = "fanout.config";

/// Prefix of the tensors that hold a trainer's resumable state, not the model's parameters.
pub const TRAIN_STATE_PREFIX: &str = "train.";

fn fmt_err(m: impl Into<String>) -> ComputeError {
    ComputeError::Format(m.into())
}

/// Serialises `model`'s parameters and configuration to safetensors bytes.
pub fn to_bytes<B: Backend>(model: &Model<B>) -> Result<Vec<u8>> {
    to_bytes_with(model, &[])
}

/// [`to_bytes`] with extra metadata entries (e.g. the sampling settings a trainer used, so that
/// evaluation can repeat them). Keys must not start with `fanout.` (reserved); `Err` if one does.
pub fn to_bytes_with<B: Backend>(model: &Model<B>, extra: &[(String, String)]) -> Result<Vec<u8>> {
    let be = model.backend();
    let host = model
        .named_params()
        .into_iter()
        .map(|(n, p)| Ok((n, be.download(&p.value)?)))
        .collect::<Result<Vec<(String, Tensor)>>>()?;
    to_bytes_parts(model.config(), &host, extra)
}

/// Serialises a checkpoint from host tensors: `config` and the model's named parameters
/// (`layers.*`, as [`Model::named_params`] names them), followed by any tensors of a trainer's
/// state (names starting with [`TRAIN_STATE_PREFIX`]), with `extra` metadata as in
/// [`to_bytes_with`]. `Err` if a name is repeated or a metadata key is reserved.
pub fn to_bytes_parts(
    config: &ModelConfig,
    host: &[(String, Tensor)],
    extra: &[(String, String)],
) -> Result<Vec<u8>> {
    if let Some((k, _)) = extra.iter().find(|(k, _)| k.starts_with("fanout.")) {
        return Err(fmt_err(format!("metadata key {k:?} is reserved")));
    }
    let bytes: Vec<Vec<u8>> = host
        .iter()
        .map(|(_, t)| t.data().iter().flat_map(|v| v.to_le_bytes()).collect())
        .collect();
    let mut views = Vec::with_capacity(host.len());
    for ((name, t), b) in host.iter().zip(&bytes) {
        let view = TensorView::new(Dtype::F32, vec![t.rows(), t.cols()], b)
            .map_err(|e| fmt_err(format!("tensor {name}: {e:?}")))?;
        views.push((name.clone(), view));
    }
    let config = serde_json::to_string(config)
        .map_err(|e| fmt_err(format!("cannot encode configuration: {e}")))?;
    let mut meta = HashMap::from([
        (FORMAT_KEY.to_string(), FORMAT.to_string()),
        (CONFIG_KEY.to_string(), config),
    ]);
    meta.extend(extra.iter().cloned());
    safetensors::serialize(views, &Some(meta)).map_err(|e| fmt_err(format!("{e:?}")))
}

/// Writes `model` to `path` (through a temporary file in the same directory, renamed into
/// place, so a crash never leaves a truncated checkpoint under `path`).
pub fn save<B: Backend>(model: &Model<B>, path: &Path) -> Result<()> {
    save_bytes(&to_bytes(model)?, path)
}

/// Writes checkpoint bytes (from [`to_bytes`] or [`to_bytes_with`]) to `path`, atomically as
/// [`save`] does ([`write_atomically`]).
pub fn save_bytes(bytes: &[u8], path: &Path) -> Result<()> {
    write_atomically(path, bytes).map_err(|source| ComputeError::Io {
        path: path.display().to_string(),
        source,
    })
}

/// Writes `bytes` to the file `path` so that it holds either what it held before or all of
/// `bytes`, never a part: through a temporary file with a unique hidden name in the same
/// folder, renamed over it at the end and removed if anything fails. A symbolic link is
/// written through (the file it points to is replaced, the link stays). A destination that
/// exists but is not a regular file, such as `/dev/stdout` or a pipe, cannot be replaced and
/// is written in place; a folder is an error. Every output fanout writes (metrics,
/// checkpoints) goes through here.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    // The process's own output streams, written through their open handles: reopening them
    // by name would truncate (or, once resolved to the file they were redirected to,
    // replace) what the shell already wrote there.
    if path == Path::new("/dev/stdout") {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        return out.write_all(bytes).and_then(|()| out.flush());
    }
    if path == Path::new("/dev/stderr") {
        use std::io::Write;
        return std::io::stderr().lock().write_all(bytes);
    }
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => Err(std::io::Error::other("is a folder; expected a file name")),
        Ok(m) if !m.is_file() => std::fs::write(path, bytes),
        // A regular file, perhaps behind links: the file itself is replaced.
        Ok(_) => replace(&std::fs::canonicalize(path)?, bytes),
        // A link to nothing: writing through it creates its target (there was nothing to keep).
        Err(e)
            if e.kind() == std::io::ErrorKind::NotFound
                && std::fs::symlink_metadata(path).is_ok() =>
        {
            std::fs::write(path, bytes)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => replace(path, bytes),
        Err(e) => Err(e),
    }
}

/// The temporary-file-and-rename of [`write_atomically`] for a path that is not a link.
fn replace(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let name = path
        .file_name()
        .map_or("output".into(), |n| n.to_string_lossy().into_owned());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let tmp = path.with_file_name(format!(".{name}.tmp-{}-{nanos}", std::process::id()));
    // The replaced file keeps its permissions (a private checkpoint stays private).
    let keep = std::fs::metadata(path).ok().map(|m| m.permissions());
    let done = std::fs::write(&tmp, bytes)
        .and_then(|()| keep.map_or(Ok(()), |p| std::fs::set_permissions(&tmp, p)))
        .and_then(|()| std::fs::rename(&tmp, path));
    if done.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    done
}

/// Every metadata entry of a safetensors file (the reserved `fanout.*` ones included), without
/// checking that it is a fanout checkpoint. `Err` if the bytes are not a safetensors file.
pub fn read_metadata(bytes: &[u8]) -> Result<HashMap<String, String>> {
    let (_, meta) = SafeTensors::read_metadata(bytes).map_err(|e| not_safetensors(bytes, e))?;
    Ok(meta.metadata().clone().unwrap_or_default())
}

/// Reads the configuration stored in a checkpoint without building the model.
pub fn read_config(bytes: &[u8]) -> Result<ModelConfig> {
    let (_, meta) = SafeTensors::read_metadata(bytes).map_err(|e| not_safetensors(bytes, e))?;
    let map = meta
        .metadata()
        .as_ref()
        .ok_or_else(|| fmt_err("no metadata: not a fanout checkpoint"))?;
    match map.get(FORMAT_KEY) {
        Some(f) if f == FORMAT => {}
        Some(f) => {
            return Err(fmt_err(format!(
                "format {f:?}, this build reads {FORMAT:?}"
            )))
        }
        None => {
            return Err(fmt_err(format!(
                "no {FORMAT_KEY} entry: not a fanout checkpoint"
            )))
        }
    }
    let json = map
        .get(CONFIG_KEY)
        .ok_or_else(|| fmt_err(format!("no {CONFIG_KEY} entry")))?;
    let config: ModelConfig = serde_json::from_str(json)
        .map_err(|e| fmt_err(format!("{CONFIG_KEY} is not a valid configuration: {e}")))?;
    config.validate()?;
    Ok(config)
}

/// Rebuilds a model on `be` from checkpoint bytes (see the module documentation for what is
/// checked). Gradients start at zero.
pub fn from_bytes<B: Backend>(be: B, bytes: &[u8]) -> Result<Model<B>> {
    let config = read_config(bytes)?;
    let st = deserialize(bytes)?;
    check_config_fits(&config, &st)?;
    let mut model = Model::new(be.clone(), config)?;
    let names: Vec<String> = model.named_params().into_iter().map(|(n, _)| n).collect();
    let mut in_file: Vec<String> = st
        .names()
        .into_iter()
        .filter(|n| !n.starts_with(TRAIN_STATE_PREFIX))
        .cloned()
        .collect();
    in_file.sort();
    if let Some(extra) = in_file.iter().find(|n| !names.contains(n)) {
        return Err(fmt_err(format!(
            "unexpected tensor {extra} (the configuration's model has no such parameter)"
        )));
    }
    for (name, p) in names.iter().zip(model.params_mut()) {
        let (r, c) = be.shape(&p.value);
        let t = tensor_from(&st, name, r, c)?;
        p.value = be.upload(&t)?;
    }
    Ok(model)
}

/// The error for bytes whose safetensors header cannot be read.
fn not_safetensors(bytes: &[u8], e: impl std::fmt::Debug) -> ComputeError {
    fmt_err(format!(
        "not a safetensors file ({} bytes; truncated or damaged?): {e:?}",
        bytes.len()
    ))
}

/// Parses safetensors bytes (a truncated or garbled file is a [`ComputeError::Format`]).
fn deserialize(bytes: &[u8]) -> Result<SafeTensors<'_>> {
    SafeTensors::deserialize(bytes).map_err(|e| not_safetensors(bytes, e))
}

/// Refuses a configuration whose widths no tensor of the file has (a damaged `fanout.config`
/// would otherwise make [`Model::new`] allocate a huge model before the shape checks run).
fn check_config_fits(config: &ModelConfig, st: &SafeTensors<'_>) -> Result<()> {
    let tensors = st.tensors();
    let largest = tensors
        .iter()
        .flat_map(|(_, v)| v.shape().to_vec())
        .max()
        .unwrap_or(0);
    // A one-layer GCN, SAGE or GAT has no hidden representation: `hidden` sizes nothing.
    let hidden_used = config.num_layers > 1
        || matches!(
            config.kind,
            crate::model::ModelKind::Gin | crate::model::ModelKind::PinSage
        );
    let widths = [
        ("in_dim", config.in_dim),
        ("hidden", if hidden_used { config.hidden } else { 0 }),
        ("num_classes", config.num_classes),
        ("heads", config.heads),
    ];
    for (field, v) in widths {
        if v > largest {
            return Err(fmt_err(format!(
                "{CONFIG_KEY} has {field} {v}, but no tensor in the file is that wide (largest \
                 dimension {largest}): the configuration does not describe these tensors"
            )));
        }
    }
    if config.num_layers > tensors.len() {
        return Err(fmt_err(format!(
            "{CONFIG_KEY} has num_layers {}, but the file holds only {} tensors",
            config.num_layers,
            tensors.len()
        )));
    }
    Ok(())
}

/// The F32 tensor `name` of `st`, checked to be `[rows, cols]`.
fn tensor_from(st: &SafeTensors<'_>, name: &str, rows: usize, cols: usize) -> Result<Tensor> {
    let view = st
        .tensor(name)
        .map_err(|_| fmt_err(format!("missing tensor {name}")))?;
    if view.dtype() != Dtype::F32 {
        return Err(fmt_err(format!(
            "tensor {name} has dtype {:?}, expected F32",
            view.dtype()
        )));
    }
    if view.shape() != [rows, cols] {
        return Err(fmt_err(format!(
            "tensor {name} has shape {:?}, expected [{rows}, {cols}]",
            view.shape()
        )));
    }
    let data: Vec<f32> = view
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    Ok(Tensor::new(rows, cols, data))
}

/// Reads tensor `name` of checkpoint bytes, checked to be F32 of shape `[rows, cols]` (a
/// trainer's state tensors are read this way). `Err` naming the tensor if it is missing or
/// differs.
pub fn read_tensor(bytes: &[u8], name: &str, rows: usize, cols: usize) -> Result<Tensor> {
    tensor_from(&deserialize(bytes)?, name, rows, cols)
}

/// Reads a checkpoint written by [`save`] and rebuilds the model on `be`.
pub fn load<B: Backend>(be: B, path: &Path) -> Result<Model<B>> {
    let bytes = std::fs::read(path).map_err(|source| ComputeError::Io {
        path: path.display().to_string(),
        source,
    })?;
    from_bytes(be, &bytes)
}
