"""The ``train:`` section of a job: what every rank runs (data, model, loss, sampler, optimizer, schedule,
two-stage methods and the run mechanics). Consumed by ``hpc_train/train/``; torch-free.

The dataclass fields *are* the schema (see :mod:`hpc_train.config.typed`), single-field bounds beside them
(:mod:`hpc_train.config.bounds`); cross-field checks live in :mod:`hpc_train.config.validate`. All train
dataclasses stay together in this one module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

from .bounds import bounded

DatasetName = Literal["cifar10-lt", "cifar100-lt", "list", "imagefolder", "digits-lt", "synthetic-lt"]
ModelName = Literal[
    "resnet32", "small_cnn", "resnet18", "resnet34", "resnet34_cifar", "resnet50", "resnet101",
    "resnext50_32x4d", "resnext101_32x8d",
]  # fmt: skip
LossName = Literal["ce", "focal", "ldam", "balanced_softmax", "logit_adjusted", "label_aware_smoothing",
                   "sigmoid_focal", "softmax_bce"]
SamplerName = Literal["instance", "class_balanced", "sqrt", "progressive", "class_aware"]
PLUGIN_HINT = "or a plug-in 'package.module:function' (docs/training.md, Plug-ins)"
"""Data set, model and loss may also be a plug-in of the user's own, named by its import path."""


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Which images, how the long tail is made, and how batches are produced."""

    name: str = "digits-lt"
    """Data set (:data:`DatasetName`): CIFAR-LT from the official python pickles, a list file, an ImageFolder
    tree, ``digits-lt`` (scikit-learn's bundled real digits), ``synthetic-lt`` (generated), or a plug-in
    ``package.module:function`` called as ``function(data_config, **args)`` returning a ``DataSource``."""
    args: Mapping[str, Any] = field(default_factory=dict)
    """Keyword arguments of a plug-in data set (built-in sets take none)."""
    root: str = "data"
    """Directory holding the data set files: ``cifar-10-batches-py`` / ``cifar-100-python`` for CIFAR,
    the image root of list files, the ``train/`` and ``test/`` (or ``val/``) folders of ImageFolder."""
    imbalance_factor: float = bounded(100.0, low=1, says=">= 1 (n_max/n_min)")
    """n_max / n_min of the training set (1 keeps it balanced)."""
    profile: Literal["exp", "step"] = "exp"
    """How class sizes fall from head to tail (LDAM-DRW's ``exp`` and ``step``)."""
    seed: int = bounded(0, low=0, says="0 or more")
    """Seed of the long-tail subsampling and of the held-out splits (LDAM-DRW uses 0); numpy's RandomState
    takes 0 to 2^32 - 1."""
    train_list: str | None = None
    """List-file data sets: ``relative/path label`` per line, paths relative to ``root`` (the list
    file itself: absolute, or relative to ``root``)."""
    val_list: str | None = None
    """List-file held-out split (used to choose τ; never the test list)."""
    test_list: str | None = None
    """List-file test split (what the reported accuracies are measured on)."""
    val_fraction: float = bounded(0.0, low=0, high=1, high_open=True)
    """Held-out fraction of the training set per class (at least one image per class), on which the best
    epoch (stage 2 and τ-normalisation start from it) and τ are chosen. It shrinks the training set, so the
    published CIFAR-LT counts hold only at 0."""
    num_classes: int = bounded(10, low=2)
    """Classes of ``synthetic-lt`` (the other data sets know their own)."""
    max_per_class: int = bounded(500, low=1)
    """Head-class size of ``synthetic-lt``; cap on the head class of long-tail subsampled ImageFolder sets."""
    test_per_class: int = bounded(50, low=1)
    """Balanced test images per class of ``digits-lt`` (held out from the real digits before the long
    tail is cut) and of ``synthetic-lt``."""
    image_size: int = bounded(32, low=1)
    """Side of the training crops of on-disk sets (list, ImageFolder: 224 for ImageNet-style data) and of
    ``synthetic-lt`` images. CIFAR is 32 and digits 8 whatever this says."""
    random_crop_padding: int | None = bounded(None, low=0, says="0 or more")
    """Random-crop padding of in-memory sets (zero padding, crop back to size). Unset: 4 for 32-pixel
    sets (the CIFAR recipe), 1 for the 8-pixel digits."""
    random_flip: bool | None = None
    """Random horizontal flips. Unset: on, except for ``digits-lt`` (a flipped digit is another glyph)."""
    num_workers: int = bounded(4, low=0, says="0 or more")
    """DataLoader workers per rank for on-disk (large) data sets; in-memory sets ignore it."""
    download: bool = False
    """Allow downloading CIFAR when the files are missing (never on by default)."""
    stage_to: str | None = None
    """Copy a list-file data set's images to this node-local directory before training (e.g. ``/tmp``
    or ``$TMPDIR``); one rank per node copies, files already there with the same size are kept."""
    color_jitter: float = bounded(0.4, low=0)
    """Brightness, contrast and saturation jitter of on-disk training images (list, ImageFolder):
    classifier-balancing's ``ColorJitter(0.4, 0.4, 0.4, 0)`` for ImageNet-LT and Places-LT; 0 turns it
    off. In-memory sets (CIFAR, digits, synthetic) ignore it."""


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """The network: a backbone that produces features and a classifier on top."""

    name: str = "small_cnn"
    """``resnet32`` (CIFAR ResNet, option-A shortcuts), ``small_cnn`` (digits), a torchvision ResNet/ResNeXt
    built without pretrained weights (:data:`ModelName`; ``resnet34_cifar`` is torchvision's ResNet-34 with the
    3×3 stride-1 stem and no max-pool that weight balancing and ImbSAM train on CIFAR), or a plug-in
    ``package.module:function`` called as ``function(num_classes=..., in_channels=..., **args)`` returning a
    feature backbone (see docs/training.md)."""
    args: Mapping[str, Any] = field(default_factory=dict)
    """Keyword arguments of a plug-in model (built-in models take none)."""
    classifier: Literal["linear", "cosine"] = "linear"
    """``cosine`` normalises features and weights (LDAM's NormedLinear; the loss applies
    ``loss.ldam_scale``, so pair it with ``ldam``)."""


@dataclass(frozen=True, kw_only=True)
class LossConfig:
    """Training loss and per-class re-weighting."""

    name: str = "ce"
    """``ce``, ``focal``, ``ldam``, ``balanced_softmax`` (logits + log n_c), ``logit_adjusted`` (logits +
    τ log π_c), ``label_aware_smoothing`` (MiSLAS), ``sigmoid_focal`` (per-class sigmoid focal loss, Cui et al.;
    with ``reweight: class_balanced`` their CB focal loss), ``softmax_bce`` (binary cross-entropy of the softmax
    probabilities, averaged over batch x classes: weight balancing's stage-2 CB loss with ``reweight:
    class_balanced``) (:data:`LossName`), or a plug-in
    ``package.module:function`` called as ``function(counts=..., **args)`` returning ``loss(logits, target) ->
    per-sample values``."""
    args: Mapping[str, Any] = field(default_factory=dict)
    """Keyword arguments of a plug-in loss (built-in losses take none)."""
    label_smoothing: float = bounded(0.0, low=0, high=1, high_open=True)
    """Label smoothing of ``ce`` (the other losses reject it rather than ignore it)."""
    focal_gamma: float = bounded(1.0, low=0)
    """Focusing parameter γ of ``focal`` and ``sigmoid_focal`` (LDAM-DRW and Cui et al.'s CIFAR scripts use 1;
    ``sigmoid_focal`` with γ = 0 is their sigmoid loss)."""
    ldam_max_margin: float = bounded(0.5, low=0, low_open=True)
    """Largest LDAM margin (the rarest class's); margins fall as n_c^-1/4."""
    ldam_scale: float = bounded(30.0, low=0, low_open=True)
    """Logit scale s of LDAM (needed with the cosine classifier, whose logits lie in [-1, 1])."""
    tau: float = 1.0
    """Temperature of the logit-adjusted loss (1.0 is the paper's choice)."""
    reweight: Literal["none", "class_balanced"] = "none"
    """Per-class loss weights from the start (effective number of samples, ``cb_beta``)."""
    cb_beta: float = bounded(0.9999, low=0, high=1, high_open=True)
    """β of the class-balanced weights (1-β)/(1-β^n_c), normalised to sum to the number of classes."""
    drw_epoch: int | None = None
    """Deferred re-weighting: class-balanced weights from this epoch index on (LDAM-DRW: 160)."""
    normalise: Literal["weight_sum", "batch_size"] = "weight_sum"
    """What the softmax cross-entropy losses (``ce``, ``ldam``, ``balanced_softmax``, ``logit_adjusted``,
    ``label_aware_smoothing``, plug-ins) divide the global batch's summed loss by: the summed class weights of its
    targets (``weight_sum``: ``F.cross_entropy(weight=w)``, LDAM-DRW) or its size (``batch_size``: Cui et al.'s
    class-balanced softmax, TensorFlow's default reduction). Equal without class weights. ``focal``,
    ``sigmoid_focal`` and ``softmax_bce`` are batch means in their references and always divide by the batch
    size."""
    smooth_head: float = bounded(0.4, low=0, high=1)
    """``label_aware_smoothing``: the smoothing ε of the most frequent class (MiSLAS's CIFAR-100-LT IF 100
    config: 0.4; CIFAR-10-LT: 0.3)."""
    smooth_tail: float = bounded(0.1, low=0, high=1)
    """``label_aware_smoothing``: ε of the rarest class (MiSLAS: 0.1 on CIFAR-100-LT, 0.0 on CIFAR-10-LT); the
    classes between follow MiSLAS's concave ramp ε_c = tail + (head - tail)·sin(π/2·(n_c - n_min)/(n_max -
    n_min))."""
    posthoc_tau: float | None = None
    """Also evaluate with post-hoc logit adjustment, logits - tau * log(prior) (reported as ``posthoc``)."""


@dataclass(frozen=True, kw_only=True)
class SamplerConfig:
    """How training indices are drawn; every sampler is distributed-aware (one global sequence per epoch)."""

    name: SamplerName = "instance"
    """``instance`` (a permutation), ``class_balanced`` (class uniform, then instance), ``sqrt`` (class
    ∝ sqrt(n_c)) or ``progressive`` (instance → class-balanced over ``progressive_epochs``)."""
    progressive_epochs: int | None = bounded(None, low=1)
    """Progressively balanced: epochs over which sampling moves from instance to class-balanced
    (default: all epochs of the stage)."""
    per_class_draw: int = bounded(4, low=1)
    """``class_aware``: images taken from a class each time the class comes up (classifier-balancing's
    ``num_samples_cls``)."""


@dataclass(frozen=True, kw_only=True)
class OptimConfig:
    """Optimizer (weight decay applies to every parameter, as in LDAM-DRW)."""

    name: Literal["sgd", "adamw"] = "sgd"
    lr: float = bounded(0.1, low=0, low_open=True)
    """Learning rate for ``batch_size`` (the global batch)."""
    momentum: float = 0.9
    """SGD momentum (AdamW ignores it)."""
    weight_decay: float = bounded(2e-4, low=0)
    nesterov: bool = False
    scale_lr: bool = False
    """Linear scaling: lr * batch_size / ``base_batch_size``."""
    base_batch_size: int = bounded(128, low=1)
    """The batch size ``lr`` was tuned for (used by ``scale_lr``)."""
    sam_rho: float = bounded(0.0, low=0)
    """Sharpness-aware minimisation (SAM): the radius ρ of the ascent step w + ρ·g/‖g‖ (0: off). Each step
    takes two forward-backward passes: the ascent gradient g (all-reduced across ranks first: one global ε),
    then the gradient at the perturbed weights, with which the optimizer steps from w. Saddle-LongTail trains
    LDAM-DRW with ρ 0.8 on CIFAR-LT."""
    sam_tail_below: int = bounded(0, low=0)
    """ImbSAM: classes with fewer training images than this get the sharpness-aware step, the others a plain
    one (the ascent direction is the tail part's gradient only; ImbSAM's ``--eta``: 20). 0: SAM on every class."""
    sam_tail_weight: float = bounded(2.0, low=0, low_open=True)
    """ImbSAM: the factor on the tail part of the loss (its code multiplies the tail loss by 2,
    ``utils/trainval.py``); used only when ``sam_tail_below`` > 0."""


@dataclass(frozen=True, kw_only=True)
class ScheduleConfig:
    """Learning-rate schedule, a pure function of (epoch, step) so resuming needs no extra state."""

    name: Literal["multistep", "cosine", "constant"] = "multistep"
    """``multistep``: ×gamma at each milestone; ``cosine``: per-step cosine to 0 after warm-up."""
    warmup_epochs: int = bounded(0, low=0)
    """Linear warm-up per epoch: lr * (epoch + 1) / warmup_epochs for the first epochs (LDAM-DRW: 5)."""
    milestones: tuple[int, ...] = ()
    """``multistep``: epoch indices where lr is multiplied by ``gamma`` (cumulatively)."""
    gamma: float = 0.1
    """``multistep`` factor per milestone (LDAM-DRW: 0.01 at 160 and again at 180)."""
    update: Literal["step", "epoch", "epoch_start"] = "step"
    """``cosine``: the lr changes every optimizer step, or once per epoch as classifier-balancing's
    ``CosineAnnealingLR`` stepped at the start of each epoch (``epoch``: epoch e runs at the rate of e + 1,
    so the last epoch runs at 0), or as MiSLAS sets it (``epoch_start``: epoch e at the rate of e, the first
    at the full rate)."""


@dataclass(frozen=True, kw_only=True)
class TwoStageConfig:
    """Decoupled classifier re-training (cRT) and τ-normalisation after the main training."""

    crt_epochs: int = bounded(0, low=0)
    """Epochs of classifier re-training with frozen features and class-balanced sampling (0: off)."""
    crt_lr: float = bounded(0.2, low=0, low_open=True)
    """Peak lr of cRT (cosine schedule, no warm-up; scaled like ``optim.lr`` when ``scale_lr``)."""
    crt_sampler: SamplerName = "class_aware"
    """Sampler of the cRT epochs (default: classifier-balancing's class-aware sampler, with
    ``sampler.per_class_draw`` images per draw and floor(N / batch) steps per epoch)."""
    crt_bn: Literal["reestimate", "shift", "frozen"] = "reestimate"
    """BatchNorm in cRT: ``reestimate`` keeps the frozen backbone in training mode, so its statistics are
    re-estimated on the class-balanced batches (classifier-balancing); ``shift`` is MiSLAS's name for the same
    (its shifted BatchNorm: ``model.train()`` under ``no_grad`` in stage 2); ``frozen`` keeps stage 1's."""
    crt_reinit: bool = True
    """Re-initialise the classifier when stage 2 starts (cRT: a new ``nn.Linear``, PyTorch's default init); false
    fine-tunes the stage-1 classifier, as MiSLAS and weight balancing do."""
    crt_loss: LossConfig = field(default_factory=LossConfig)
    """The loss of stage 2, a section like ``train.loss`` (default: cross-entropy, classifier-balancing's cRT;
    MiSLAS: ``label_aware_smoothing``; weight balancing: class-balanced)."""
    crt_weight_decay: float | None = bounded(None, low=0)
    """Weight decay of stage 2 (unset: ``optim.weight_decay``; weight balancing: 0.1)."""
    crt_max_norm: float | None = bounded(None, low=0, high=1)
    """Weight balancing's MaxNorm (``MaxNorm_via_PGD``): at the start of stage 2 the radius is fixed at
    min + t·(max - min) of the classifier's per-class weight norms (t this value; its demo: 0.1), and after
    every stage-2 epoch each class vector longer than the radius is scaled back onto it (the bias is not
    constrained). Unset: off."""
    crt_lr_update: Literal["step", "epoch", "epoch_start"] = "epoch"
    """When cRT's cosine lr changes (see ``schedule.update``; ``epoch`` is classifier-balancing's,
    ``epoch_start`` MiSLAS's)."""
    tau_norm: bool = False
    """τ-normalise the classifier weights (w_c / ||w_c||^τ, bias dropped); τ is picked on the held-out
    split (``data.val_fraction`` or ``data.val_list``) from 0, 0.1, ..., 2, never on test."""


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """What every rank runs: data, model, loss, sampler, optimizer, schedule and the run mechanics."""

    device: Literal["auto", "cuda", "cpu"] = "auto"
    """``auto`` uses CUDA when the job asked for GPUs and fails when CUDA is missing; ``cpu`` forces CPU."""
    strategy: Literal["ddp", "dp", "none"] = "ddp"
    """``ddp`` (one process per device); ``dp`` legacy single-process DataParallel over the visible
    GPUs of one node (kept for old recipes; slower than DDP); ``none`` (one process, one device)."""
    seed: int = 0
    """Seed of model initialisation, sampling and augmentation (data subsampling uses ``data.seed``)."""
    epochs: int = bounded(30, low=1)
    """Epochs of the main training (cRT epochs come on top)."""
    batch_size: int = bounded(128, low=1)
    """Global batch (all ranks together); must split evenly across ranks."""
    eval_batch_size: int = bounded(256, low=1)
    """Evaluation batch per rank."""
    sync_bn: Literal["auto", True, False] = "auto"
    """Synchronised BatchNorm across ranks (statistics of the whole global batch). ``auto``: on when
    a rank's batch is below 32 images and more than one rank trains (one log line says so). On at
    every world size > 1 it makes the weights independent of the world size. CUDA uses PyTorch's
    SyncBatchNorm, CPUs (gloo) hpc-train's own."""
    tf32: bool = True
    """TF32 for float32 matmuls and convolutions on Ampere and newer GPUs (faster, ~1e-3 relative
    precision). Off: IEEE float32, as the reference implementations ran."""
    amp: Literal["off", "bf16", "fp16"] = "off"
    """Mixed precision: ``bf16`` (A100/H100 and newer), ``fp16`` with a gradient scaler (V100/T4), ``off``."""
    channels_last: bool = False
    """NHWC memory format for model and inputs (faster convolutions with AMP on tensor cores)."""
    amp_weight_copy: bool = True
    """With ``amp``: keep one copy of the backbone's convolution and linear weights in the AMP dtype, refreshed
    after each optimizer step by one fused copy, instead of autocast casting every weight in every forward pass
    and its gradient back (the same numbers; not with ``compile``, which fuses the casts itself)."""
    compile: bool = False
    """``torch.compile`` the model (the first steps are slow while it compiles; one graph per batch shape,
    never recompiled). Combined with ``cuda_graphs``, the compiled step is captured."""
    compile_cache_dir: str | None = None
    """Persistent compile cache (``TORCHINDUCTOR_CACHE_DIR``; ``$VARS`` and ``~`` expanded), so the second
    run of a recipe compiles in seconds; a site file can point it at a shared filesystem. Unset: torch's
    default (``/tmp/torchinductor_$USER``, per node)."""
    cuda_graphs: Literal["auto", True, False] = "auto"
    """Capture the whole training step (batch gather, augmentation, forward, loss, backward, optimizer)
    as CUDA graphs, one per batch shape, and replay them: no host work and no host synchronisation per
    step. ``auto``: on for CUDA at world size 1 with an in-memory data set, not fp16, not ``dp`` (one log
    line says why when off); ``on`` (``true``): also at world size > 1, where the gradient all-reduce is
    captured (unverified on GPUs); ``off`` (``false``): eager steps. A capture that fails falls back to
    eager steps with one log line."""
    cudnn_benchmark: bool = True
    """Let cuDNN pick the fastest convolution algorithms (ignored when ``deterministic``)."""
    deterministic: bool = False
    """Deterministic kernels (slower); resume tests use it on CPU."""
    num_threads: int | None = bounded(None, low=1)
    """CPU threads per rank (intra-op). Unset: ``$OMP_NUM_THREADS``, else the usable cores divided by
    the ranks on this node."""
    eval_every_epochs: int = bounded(1, low=1)
    """Evaluate on the test split every this many epochs (and always after the last one)."""
    checkpoint_every_epochs: int = bounded(1, low=1)
    """Checkpoint every this many epochs (and always at the end and on preemption)."""
    checkpoint_every_s: float | None = bounded(None, low=0, low_open=True)
    """Periodic checkpoints by time instead: at the first step boundary where the ranks agree (every
    ``preempt_check_every_steps``) at least this many seconds after the previous checkpoint (rank 0's
    clock), mid-epoch included; ``checkpoint_every_epochs`` is then ignored. Always one at the end of
    each stage and on preemption. Checkpoints are copied to host memory and written in the background."""
    keep_checkpoints: int = bounded(2, low=1)
    """Checkpoints kept in the run directory (older ones are deleted after a successful save)."""
    log_every_steps: int = bounded(50, low=1)
    """Progress line (epoch, step, loss, lr, images/s, ETA) every this many steps, from rank 0."""
    preempt_check_every_steps: int = bounded(10, low=1)
    """How often ranks agree on whether a preemption signal arrived (and a time-based checkpoint or a
    non-finite loss); also at every epoch end. With several ranks the agreement is a non-blocking
    all-reduce on the CPU whose answer is read at the next check, so a signal is acted on within two
    intervals. Small against the signal's lead time (``slurm.signal_delay_s``)."""
    process_group_timeout_s: int = bounded(600, low=1)
    """A dead or stuck rank ends the job after this long instead of blocking to the time limit."""
    tensorboard: bool = False
    """Also write the scalars of metrics.jsonl as TensorBoard event files (``<run dir>/tensorboard/``)."""
    mixup_alpha: float = bounded(0.0, low=0)
    """Mixup in the main stage (MiSLAS stage 1: 1.0 on CIFAR): each global batch is mixed with a permutation of
    itself, x = λ·x + (1 - λ)·x[π], loss λ·L(y) + (1 - λ)·L(y[π]), λ ~ Beta(α, α). λ and π are drawn per
    global batch from (seed, epoch, step), so the result does not depend on the world size. 0: off."""
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    two_stage: TwoStageConfig = field(default_factory=TwoStageConfig)
