//! Models: a stack of layers, one per block, with dropout between them.

use fanout_rand::{mix_keys, Rng};
use serde::{Deserialize, Serialize};

use crate::backend::{Backend, DropoutSpec};
use crate::block::BlockRef;
use crate::error::{ComputeError, Result};
use crate::layers::{
    Activation, GatLayer, GcnLayer, GinLayer, HeadMerge, InputPlan, Layer, Param, Pass,
    PinSageLayer, SageLayer,
};
use crate::source::RowSource;

/// Stream tags, so initialisation and dropout never share random numbers.
const INIT_TAG: u64 = 0x1417;
const DROPOUT_TAG: u64 = 0xD80;

/// The layer type a model is built from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelKind {
    /// [`SageLayer`] (mean aggregator).
    Sage,
    /// [`GcnLayer`] (`norm="both"`).
    Gcn,
    /// [`GatLayer`]: hidden layers concatenate `heads` heads of `hidden / heads` columns, the
    /// output layer averages `heads` heads of `num_classes` columns.
    Gat,
    /// [`GinLayer`] with MLPs `hidden` wide.
    Gin,
    /// [`PinSageLayer`]: `Q` is `hidden` wide; hidden layers normalise their output rows.
    #[serde(rename = "pinsage")]
    PinSage,
}

impl ModelKind {
    /// Every kind, in declaration order.
    pub const ALL: [ModelKind; 5] = [
        ModelKind::Sage,
        ModelKind::Gcn,
        ModelKind::Gat,
        ModelKind::Gin,
        ModelKind::PinSage,
    ];

    /// Lower-case name (`"sage"`, `"gcn"`, `"gat"`, `"gin"`, `"pinsage"`), as in checkpoints.
    pub fn name(self) -> &'static str {
        match self {
            ModelKind::Sage => "sage",
            ModelKind::Gcn => "gcn",
            ModelKind::Gat => "gat",
            ModelKind::Gin => "gin",
            ModelKind::PinSage => "pinsage",
        }
    }
}

/// Everything needed to build a [`Model`] (and stored in its checkpoints).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    /// Layer type.
    pub kind: ModelKind,
    /// Width of the input features.
    pub in_dim: usize,
    /// Width of every hidden representation (GAT: all heads together).
    pub hidden: usize,
    /// Number of classes: the width of the logits.
    pub num_classes: usize,
    /// Number of layers = number of blocks per mini-batch.
    pub num_layers: usize,
    /// Dropout probability applied to each hidden layer's output in training (not to the
    /// input features, not to the logits).
    pub dropout: f32,
    /// Attention heads (GAT only; must divide `hidden`). 1 for other kinds.
    pub heads: usize,
    /// Seed of the parameter initialisation and of the dropout masks.
    pub seed: u64,
}

impl ModelConfig {
    /// A configuration with dropout 0.5, seed 0, and 8 heads for GAT (1 otherwise).
    pub fn new(
        kind: ModelKind,
        in_dim: usize,
        hidden: usize,
        num_classes: usize,
        num_layers: usize,
    ) -> Self {
        ModelConfig {
            kind,
            in_dim,
            hidden,
            num_classes,
            num_layers,
            dropout: 0.5,
            heads: if kind == ModelKind::Gat { 8 } else { 1 },
            seed: 0,
        }
    }

    /// Checks that a model can be built: at least one layer, positive widths, dropout in
    /// `[0, 1)`, `heads >= 1` dividing `hidden` for GAT.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: &str| Err(ComputeError::Config(m.to_string()));
        if self.num_layers == 0 {
            return bad("num_layers must be at least 1");
        }
        if self.in_dim == 0 || self.num_classes == 0 || self.hidden == 0 {
            return bad("in_dim, num_classes and hidden must be positive");
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return bad("dropout must be in [0, 1)");
        }
        if self.heads == 0 {
            return bad("heads must be at least 1");
        }
        if self.kind == ModelKind::Gat && !self.hidden.is_multiple_of(self.heads) {
            return bad("GAT hidden size must be a multiple of heads");
        }
        Ok(())
    }

    /// `(in, out)` width of each layer, input layer first.
    pub fn layer_dims(&self) -> Vec<(usize, usize)> {
        (0..self.num_layers)
            .map(|i| {
                let i_in = if i == 0 { self.in_dim } else { self.hidden };
                let i_out = if i + 1 == self.num_layers {
                    self.num_classes
                } else {
                    self.hidden
                };
                (i_in, i_out)
            })
            .collect()
    }
}

/// The training setting a paper uses for a model kind (see `NOTES.md`, "Models").
#[derive(Clone, Debug, PartialEq)]
pub struct PaperSetting {
    /// The model (dropout 0.5, seed 0).
    pub model: ModelConfig,
    /// Fanouts in hop order from the seeds (`fanouts[0]` for the seeds' own neighbours, i.e.
    /// the block of the *last* layer). PinSAGE: neighbours kept per hop by the random walks.
    pub fanouts: Vec<usize>,
    /// Seeds per mini-batch.
    pub batch_size: usize,
    /// Adam learning rate.
    pub lr: f32,
}

impl PaperSetting {
    /// GNNLab's GCN (3 layers, 15,10,5), GraphSAGE (2 layers, 10,25) and PinSAGE (3 layers,
    /// top-5 walk neighbours), hidden 256; FastGL's GAT (3 layers, 8 heads x 8) and GIN
    /// (3 layers, hidden 64), fanouts 15,10,5. All: batch 8000, Adam lr 0.003, dropout 0.5.
    pub fn for_kind(kind: ModelKind, in_dim: usize, num_classes: usize) -> Self {
        let (layers, hidden, fanouts) = match kind {
            ModelKind::Gcn => (3, 256, vec![15, 10, 5]),
            ModelKind::Sage => (2, 256, vec![10, 25]),
            ModelKind::PinSage => (3, 256, vec![5, 5, 5]),
            ModelKind::Gat => (3, 64, vec![15, 10, 5]),
            ModelKind::Gin => (3, 64, vec![15, 10, 5]),
        };
        PaperSetting {
            model: ModelConfig::new(kind, in_dim, hidden, num_classes, layers),
            fanouts,
            batch_size: 8000,
            lr: 0.003,
        }
    }
}

/// Training or inference.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// No dropout, nothing cached for backward.
    Eval,
    /// Dropout on, activations cached. The masks are a pure function of the model seed,
    /// `dropout_key` (e.g. a hash of epoch and step) and the layer index.
    Train {
        /// Distinguishes the masks of different steps.
        dropout_key: u64,
    },
}

/// A GNN: `num_layers` layers, layer `i` running on block `i` (blocks outermost first, as the
/// sampler emits them), ReLU and dropout between layers, logits out of the last one.
pub struct Model<B: Backend> {
    be: B,
    config: ModelConfig,
    layers: Vec<Box<dyn Layer<B>>>,
}

impl<B: Backend> std::fmt::Debug for Model<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("backend", &self.be.name())
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<B: Backend> Model<B> {
    /// Builds the model of `config` with freshly initialised parameters (a pure function of
    /// `config.seed`). `Err` if the configuration is invalid.
    pub fn new(be: B, config: ModelConfig) -> Result<Self> {
        config.validate()?;
        let n = config.num_layers;
        let mut layers: Vec<Box<dyn Layer<B>>> = Vec::with_capacity(n);
        for (i, (din, dout)) in config.layer_dims().into_iter().enumerate() {
            let last = i + 1 == n;
            let act = if last {
                Activation::None
            } else {
                Activation::Relu
            };
            let mut rng = Rng::keyed(&[config.seed, INIT_TAG, i as u64]);
            let rng = &mut rng;
            let b = be.clone();
            let layer: Box<dyn Layer<B>> = match config.kind {
                ModelKind::Sage => Box::new(SageLayer::new(b, din, dout, act, rng)?),
                ModelKind::Gcn => Box::new(GcnLayer::new(b, din, dout, act, rng)?),
                ModelKind::Gin => Box::new(GinLayer::new(b, din, config.hidden, dout, act, rng)?),
                ModelKind::PinSage => Box::new(PinSageLayer::new(
                    b,
                    din,
                    config.hidden,
                    dout,
                    act,
                    !last,
                    rng,
                )?),
                ModelKind::Gat => {
                    let h = config.heads;
                    let (f, merge) = if last {
                        (dout, HeadMerge::Mean)
                    } else {
                        (dout / h, HeadMerge::Concat)
                    };
                    let layer = GatLayer::new(b, din, h, f, merge, act, rng)?;
                    // The input features never get a gradient (`backward`).
                    Box::new(if i == 0 {
                        layer.without_input_gradient()
                    } else {
                        layer
                    })
                }
            };
            layers.push(layer);
        }
        Ok(Model { be, config, layers })
    }

    /// The configuration the model was built from.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The backend the model runs on.
    pub fn backend(&self) -> &B {
        &self.be
    }

    /// The layers, input layer first.
    pub fn layers(&self) -> &[Box<dyn Layer<B>>] {
        &self.layers
    }

    /// Prepares a mini-batch's blocks (outermost first) on the model's device.
    pub fn prepare_blocks(&self, blocks: &[BlockRef<'_>]) -> Result<Vec<B::Block>> {
        blocks.iter().map(|b| self.be.prepare_block(b)).collect()
    }

    /// [`Model::prepare_blocks`], taking the sampler's copy of them on the model's device
    /// instead when there is one the backend knows ([`Backend::adopt_blocks`]).
    pub fn prepare_blocks_from(
        &self,
        resident: Option<&(dyn std::any::Any + Send + Sync)>,
        blocks: &[BlockRef<'_>],
    ) -> Result<Vec<B::Block>> {
        let adopted = match resident {
            Some(r) => self.be.adopt_blocks(r, blocks)?,
            None => None,
        };
        match adopted {
            Some(adopted) => Ok(adopted),
            None => self.prepare_blocks(blocks),
        }
    }

    /// Runs the model: `x` holds the input features of block 0's sources (`num_src x in_dim`);
    /// returns the logits of the last block's destinations (`num_dst x num_classes`). In
    /// [`Mode::Train`] activations and dropout masks are cached for [`Model::backward`].
    /// `Err` if the block count or any shape does not match.
    pub fn forward(&mut self, blocks: &[B::Block], x: B::Tensor, mode: Mode) -> Result<B::Tensor> {
        self.forward_rows(blocks, x, mode, None)
    }

    /// [`Model::forward`] with the global vertex id of every input row (`input_ids[r]` for row
    /// `r` of `x`; every layer's rows are a prefix of them, as destinations are a prefix of
    /// sources). Dropout masks are then keyed by vertex id instead of row index, so a vertex
    /// gets the same mask in any batch of the same step: the masks of data-parallel workers
    /// differ from each other and agree with the one-worker batch they split. `Err` if
    /// `input_ids` is shorter than `x`'s rows.
    pub fn forward_rows(
        &mut self,
        blocks: &[B::Block],
        x: B::Tensor,
        mode: Mode,
        input_ids: Option<&[u32]>,
    ) -> Result<B::Tensor> {
        let n = self.layers.len();
        if let Some(ids) = input_ids {
            let rows = self.be.shape(&x).0;
            if ids.len() < rows {
                return Err(ComputeError::State(format!(
                    "{} vertex ids for {rows} input rows",
                    ids.len()
                )));
            }
        }
        if blocks.len() != n {
            return Err(ComputeError::State(format!(
                "model has {n} layers but was given {} blocks",
                blocks.len()
            )));
        }
        for i in 1..n {
            let (prev, next) = (
                self.be.block_dims(&blocks[i - 1]),
                self.be.block_dims(&blocks[i]),
            );
            if prev.num_dst != next.num_src {
                return Err(ComputeError::Block(format!(
                    "block {} has {} destinations but block {i} has {} sources",
                    i - 1,
                    prev.num_dst,
                    next.num_src
                )));
            }
        }
        let mut h = x;
        for (i, block) in blocks.iter().enumerate() {
            h = self.forward_layer(i, block, h, mode, input_ids)?;
        }
        Ok(h)
    }

    /// The first layer's [`InputPlan`]: where it is `Some` and says so for block 0, the
    /// caller may run [`Model::forward_rows_aggregated`] instead of [`Model::forward_rows`].
    pub fn input_plan(&self) -> Option<InputPlan> {
        self.layers.first().and_then(|l| l.input_plan())
    }

    /// [`Model::forward_rows`] with block 0's input given as its destinations' rows `x_dst`
    /// and their aggregate `agg` by [`Model::input_plan`] (both `num_dst x in_dim`) instead of
    /// every source row: the same logits and training state, bit for bit, without the
    /// source rows ever being materialised. `input_ids` names at least the `num_dst` rows.
    /// `Err` if the first layer has no input plan for block 0, or on a shape mismatch.
    pub fn forward_rows_aggregated(
        &mut self,
        blocks: &[B::Block],
        x_dst: B::Tensor,
        agg: B::Tensor,
        mode: Mode,
        input_ids: Option<&[u32]>,
    ) -> Result<B::Tensor> {
        self.forward_after_first(blocks, mode, input_ids, |layer, block, pass| {
            layer.forward_aggregated(block, x_dst, agg, pass)
        })
    }

    /// [`Model::forward_rows_aggregated`] with block 0's aggregate made by `src` while the
    /// first layer multiplies it ([`Layer::forward_sourced`]): the same logits and training
    /// state, bit for bit. `Err` as `forward_rows_aggregated`.
    pub fn forward_rows_sourced(
        &mut self,
        blocks: &[B::Block],
        x_dst: B::Tensor,
        src: &dyn RowSource,
        mode: Mode,
        input_ids: Option<&[u32]>,
    ) -> Result<B::Tensor> {
        self.forward_after_first(blocks, mode, input_ids, |layer, block, pass| {
            layer.forward_sourced(block, x_dst, src, pass)
        })
    }

    /// Layer 0 by `first` (given the layer, block 0 and its pass), then the other layers as
    /// [`Model::forward_rows`] runs them. `Err` unless there is one block per layer.
    fn forward_after_first<F>(
        &mut self,
        blocks: &[B::Block],
        mode: Mode,
        input_ids: Option<&[u32]>,
        first: F,
    ) -> Result<B::Tensor>
    where
        F: FnOnce(&mut dyn Layer<B>, &B::Block, Pass<'_>) -> Result<B::Tensor>,
    {
        let n = self.layers.len();
        if blocks.len() != n || n == 0 {
            return Err(ComputeError::State(format!(
                "model has {n} layers but was given {} blocks",
                blocks.len()
            )));
        }
        let pass = self.pass(0, mode, input_ids);
        let mut h = first(self.layers[0].as_mut(), &blocks[0], pass)?;
        for (i, block) in blocks.iter().enumerate().skip(1) {
            h = self.forward_layer(i, block, h, mode, input_ids)?;
        }
        Ok(h)
    }

    /// Layer `i` alone, then (in training, below the last layer) its dropout: what
    /// [`Model::forward_rows`] does at layer `i`, for callers that move rows between layers
    /// (split parallelism). `h_src` holds the rows of `block`'s sources; `row_ids`, when given,
    /// names at least the first `num_dst` of them by global vertex id (the output rows are
    /// those), keying the dropout masks as in [`Model::forward_rows`]. `Err` if `i` is not
    /// a layer or a shape does not match.
    pub fn forward_layer(
        &mut self,
        i: usize,
        block: &B::Block,
        h_src: B::Tensor,
        mode: Mode,
        row_ids: Option<&[u32]>,
    ) -> Result<B::Tensor> {
        let n = self.layers.len();
        if i >= n {
            return Err(ComputeError::State(format!(
                "layer {i} asked of a model of {n} layers"
            )));
        }
        let pass = self.pass(i, mode, row_ids);
        self.layers[i].forward(block, h_src, pass)
    }

    /// How layer `i` runs in `mode`: in training, below the last layer, with the model's
    /// dropout on its output (the layer fuses it into its epilogue and keeps the mask).
    fn pass<'a>(&self, i: usize, mode: Mode, row_ids: Option<&'a [u32]>) -> Pass<'a> {
        match mode {
            Mode::Eval => Pass::Eval,
            Mode::Train { dropout_key } => Pass::Train {
                dropout: (i + 1 < self.layers.len() && self.config.dropout > 0.0).then(|| {
                    DropoutSpec {
                        p: self.config.dropout,
                        key: mix_keys(&[self.config.seed, DROPOUT_TAG, dropout_key, i as u64]),
                        row_ids,
                    }
                }),
            },
        }
    }

    /// Back-propagates the gradient of the loss with respect to the logits through the last
    /// training forward, adding into every parameter's gradient. The input features get no
    /// gradient (that work is skipped). `Err` without a preceding training forward.
    pub fn backward(&mut self, grad_logits: &B::Tensor) -> Result<()> {
        // The logits' gradient is borrowed, not copied: a device copy could fail, and costs.
        let mut g: Option<B::Tensor> = None;
        for i in (0..self.layers.len()).rev() {
            let grad_out = g.as_ref().unwrap_or(grad_logits);
            match self.layers[i].backward(grad_out, i > 0)? {
                Some(dx) => g = Some(dx),
                None => break,
            }
        }
        Ok(())
    }

    /// The backward of [`Model::forward_layer`] `i`: `grad_out` is the gradient with respect
    /// to what that call returned (after dropout); the layer's parameter gradients are added
    /// to, and with `need_input_grad` the gradient with respect to its `h_src` is returned.
    /// `Err` if `i` is not a layer or the layer has no cached training forward.
    pub fn backward_layer(
        &mut self,
        i: usize,
        grad_out: B::Tensor,
        need_input_grad: bool,
    ) -> Result<Option<B::Tensor>> {
        let n = self.layers.len();
        if i >= n {
            return Err(ComputeError::State(format!(
                "layer {i} asked of a model of {n} layers"
            )));
        }
        self.layers[i].backward(&grad_out, need_input_grad)
    }

    /// Sets every parameter gradient to zero; `Err` when the device fails.
    pub fn zero_grad(&mut self) -> Result<()> {
        let be = self.be.clone();
        for p in self.params_mut() {
            be.fill_zero(&mut p.grad)?;
        }
        Ok(())
    }

    /// Drops cached activations and masks (e.g. after an aborted step).
    pub fn clear_cache(&mut self) {
        self.layers.iter_mut().for_each(|l| l.clear_cache());
    }

    /// Every parameter with its checkpoint name `layers.{i}.{name}`, in a fixed order.
    pub fn named_params(&self) -> Vec<(String, &Param<B>)> {
        self.layers
            .iter()
            .enumerate()
            .flat_map(|(i, l)| {
                l.params()
                    .into_iter()
                    .map(move |p| (format!("layers.{i}.{}", p.name()), p))
            })
            .collect()
    }

    /// Every parameter, mutable, in the order of [`Model::named_params`].
    pub fn params_mut(&mut self) -> Vec<&mut Param<B>> {
        self.layers
            .iter_mut()
            .flat_map(|l| l.params_mut())
            .collect()
    }

    /// Total number of learnable scalars.
    pub fn num_params(&self) -> usize {
        self.named_params()
            .iter()
            .map(|(_, p)| {
                let (r, c) = self.be.shape(&p.value);
                r * c
            })
            .sum()
    }
}
