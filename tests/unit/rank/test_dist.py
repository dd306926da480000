"""DistEnv.from_environ: the rank mapping every task runs, for each launcher, and its fail-fast checks."""

import pytest

from hpc_train.rank.dist import DistEnv, DistError, master_port_for, simulate


def slurm_env(procid, localid, nodeid, *, ntasks=8, nodes=2, per_node="4(x2)", nodelist="gpu[01-02]", **extra):
    env = {
        "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_PROCID": str(procid), "SLURM_LOCALID": str(localid),
        "SLURM_NODEID": str(nodeid), "SLURM_NTASKS": str(ntasks), "SLURM_JOB_NUM_NODES": str(nodes),
        "SLURM_JOB_NODELIST": nodelist, "SLURM_STEP_TASKS_PER_NODE": per_node, "SLURMD_NODENAME": "gpu02",
    }
    env.update(extra)
    return env


def test_slurm_mapping_from_step_variables():
    d = DistEnv.from_environ(slurm_env(5, 1, 1))
    assert (d.rank, d.local_rank, d.node_rank, d.world_size, d.local_world_size, d.num_nodes) == (5, 1, 1, 8, 4, 2)
    assert d.source == "slurm"
    # No MASTER_ADDR exported: first host of the node list; port from the job id.
    assert d.master_addr == "gpu01"
    assert d.master_port == 20000 + 4242 % 12000 == master_port_for(4242)
    # Job ids past the span wrap around it (20000-31999: below the ephemeral ports).
    big = DistEnv.from_environ(slurm_env(5, 1, 1, SLURM_JOB_ID="54321"))
    assert big.master_port == 20000 + 54321 % 12000 == 26321
    assert d.hostname == "gpu02"


def test_slurm_prefers_exported_master_and_step_counts():
    env = slurm_env(0, 0, 0, MASTER_ADDR="10.0.0.7", MASTER_PORT="31337", SLURM_STEP_NUM_TASKS="8", SLURM_NTASKS="16")
    d = DistEnv.from_environ(env)
    assert (d.master_addr, d.master_port, d.world_size) == ("10.0.0.7", 31337, 8)


def test_array_port_uses_array_ids():
    env = slurm_env(0, 0, 0, SLURM_ARRAY_JOB_ID="100", SLURM_ARRAY_TASK_ID="2")
    assert DistEnv.from_environ(env).master_port == master_port_for(100, 2) == 20102


def test_slurm_uneven_tasks_fail_fast():
    # srun -N2 -n3: 2 tasks on one node, 1 on the other -> world != nodes x tasks per node.
    env = slurm_env(0, 0, 0, ntasks=3, per_node="2,1")
    with pytest.raises(DistError, match="--ntasks-per-node"):
        DistEnv.from_environ(env)


def test_slurm_task_count_disagreement_fails():
    env = slurm_env(0, 0, 0, ntasks=8, per_node="2(x2)")
    with pytest.raises(DistError, match="add up to 4"):
        DistEnv.from_environ(env)


def test_batch_shell_without_step_is_single_process():
    # The batch shell has SLURM_PROCID=0 and SLURM_NTASKS=8 but is not a task of a step: treating it
    # as rank 0 of 8 would hang in init_process_group.
    env = slurm_env(0, 0, 0)
    del env["SLURM_STEP_ID"]
    assert DistEnv.from_environ(env).world_size == 1


def test_torchrun_mapping_wins_over_slurm():
    env = slurm_env(0, 0, 0)
    env.update(RANK="5", LOCAL_RANK="1", WORLD_SIZE="8", LOCAL_WORLD_SIZE="4", GROUP_RANK="1",
               MASTER_ADDR="gpu01", MASTER_PORT="29400", TORCHELASTIC_RUN_ID="4242")
    d = DistEnv.from_environ(env)
    assert (d.source, d.rank, d.local_rank, d.node_rank, d.world_size, d.local_world_size) == ("torchrun", 5, 1, 1, 8, 4)


def test_torchrun_without_master_fails():
    with pytest.raises(DistError, match="MASTER_ADDR"):
        DistEnv.from_environ({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2"})


def test_submitit_local_mapping():
    env = {"SUBMITIT_LOCAL_GLOBALID": "1", "SUBMITIT_LOCAL_LOCALID": "1", "SUBMITIT_LOCAL_NTASKS": "2",
           "SUBMITIT_LOCAL_JOB_ID": "777", "MASTER_PORT": "40001", "CUDA_VISIBLE_DEVICES": ""}
    d = DistEnv.from_environ(env)
    assert (d.source, d.rank, d.local_rank, d.world_size, d.master_addr, d.master_port, d.visible_gpus) == (
        "submitit-local", 1, 1, 2, "127.0.0.1", 40001, 0)


def test_single_process():
    d = DistEnv.from_environ({})
    assert (d.source, d.rank, d.world_size, d.is_main, d.is_distributed) == ("single", 0, 1, True, False)


def test_bad_integer_is_named():
    with pytest.raises(DistError, match="SLURM_PROCID='x'"):
        DistEnv.from_environ(slurm_env("x", 0, 0))


def test_expected_world_size_mismatch():
    d = DistEnv.from_environ(slurm_env(0, 0, 0))
    with pytest.raises(DistError, match="expects 16 ranks"):
        d.check(expected_world_size=16)


def test_cuda_device_index():
    d = DistEnv.from_environ(slurm_env(5, 1, 1))
    assert d.cuda_device_index(4) == 1
    assert d.cuda_device_index(1) == 0  # per-task binding: the one visible GPU
    with pytest.raises(DistError, match="local rank 2 on gpu02 but only 2 GPU"):
        DistEnv.from_environ(slurm_env(6, 2, 1)).cuda_device_index(2)


def test_simulate_two_nodes_four_gpus():
    envs = simulate("gpu[01-02]", nodes=2, ranks_per_node=4, job_id=4242)
    table = [(d.rank, d.local_rank, d.node_rank, d.hostname, d.master_addr) for d in envs]
    expected = [(n * 4 + l, l, n, f"gpu0{n + 1}", "gpu01") for n in range(2) for l in range(4)]
    assert table == expected
    assert {d.master_port for d in envs} == {master_port_for(4242)}
    assert {d.world_size for d in envs} == {8}


def test_simulate_rejects_nodelist_of_wrong_size():
    with pytest.raises(DistError, match="has 3 hosts"):
        simulate("gpu[01-03]", nodes=2, ranks_per_node=4)
