"""Mixture of Experts: router, dispatch, experts, expert parallelism (docs/moe.md).

    config.py      MoEConfig: the training choices (flags in args.py)
    router.py      scores, top-k, load-balancing / z losses, the expert-bias update
    dispatch.py    pure (routing map, counts) -> permutation functions; capacity
    experts.py     a rank's local experts, grouped GEMM or a loop
    comm.py        autograd all-to-all / gather / reduce-scatter of token rows
    layer.py       the MoE block and its auxiliary-loss hooks
    parallel.py    parallel folding: expert-TP x EP x expert-DP over a stage's ranks, pure arithmetic
    runtime.py     per-step hooks: the aux-loss gradient scale, the expert-bias update, statistics
"""
