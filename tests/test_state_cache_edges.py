"""Edges of state_cache.py that the main tests leave open: a save is planned only while its chunk is scheduled,
only for a request that holds a live slot, and for a position passed again only once the store forgot it; a reset
drops pending copies; the slot check counts every slot and catches a slot held twice or live and free; a re-admission
keeps its plan; a position inside a block is never saved; a checkpoint's size counts the conv window in the model
dtype; a save copies both states."""

import pytest
import torch

from minipic_lite.checkpoints.planner import CheckpointPlanner
from minipic_lite.state_cache import StateCache, StateOps, StateTensors
from tests.sched_factory import make_request

B = 4


def states_and_request():
    states = StateCache(2, 4, 100, CheckpointPlanner("balanced", 1, B, "balanced"))
    req = make_request("a", range(16), B)
    return states, req


def test_a_save_is_planned_while_its_chunk_is_scheduled_not_when_the_step_publishes_again():
    states, req = states_and_request()
    states.attach(req, 0)
    req.checkpoint_positions = [8]
    req.num_computed_tokens = 8  # the step that computed [0, 8) ran; postprocess publishes [0, 8) again
    states.plan_saves(req, 8)
    assert states.ops.save == [] and req.saved_checkpoints == []
    req.num_computed_tokens = 4  # a chunk [4, 8) is being scheduled
    states.plan_saves(req, 8)
    assert states.ops.save == [(req.state_slot, 0)] and req.saved_checkpoints == [8]


def test_a_request_without_a_live_slot_plans_no_save():
    states, req = states_and_request()
    req.checkpoint_positions = [8]
    states.plan_saves(req, 8)
    assert states.ops.save == [] and req.saved_checkpoints == [] and states.stats.num_saved == 0


def test_a_request_computing_a_planned_position_again_saves_it_again_only_if_the_store_forgot_it():
    """Re-admitted after preemption (its slot released, then a fresh one from position 0): the checkpoint still
    saved is just used again; once the store has forgotten it, the new pass saves it again (listed once)."""
    states, req = states_and_request()
    states.attach(req, 0)
    req.checkpoint_positions = [8]
    states.plan_saves(req, 8)
    states.take_ops()
    for forget in (False, True):
        states.release(req)
        if forget:
            states.reset()
        states.attach(req, 0)  # the same plan: a re-admission keeps it
        states.plan_saves(req, 8)  # the chunk [0, 8) scheduled again
        saves = states.take_ops().save
        assert saves == ([(req.state_slot, states.by_hash[req.block_hashes[1]].ckpt_id)] if forget else [])
        assert req.saved_checkpoints == [8]
    assert states.stats.num_saved == 2


def test_reset_drops_the_pending_copies_with_the_checkpoints():
    states, req = states_and_request()
    states.attach(req, 0)
    req.checkpoint_positions = [8]
    states.plan_saves(req, 8)
    assert (states.ops.zero, states.ops.save) == ([req.state_slot], [(req.state_slot, 0)])
    states.reset()
    ops = states.take_ops()
    assert (ops.zero, ops.load, ops.save) == ([], [], [])
    assert list(states.free_ckpt_ids) == [1, 2, 3, 0] and states.by_hash == {}


def test_check_integrity_catches_a_slot_neither_free_nor_live():
    states, req = states_and_request()
    states.attach(req, 0)
    states.check_integrity([req.state_slot])
    with pytest.raises(AssertionError, match=r"free \+ live state slots != total"):
        states.check_integrity([])


def test_check_integrity_catches_a_slot_held_twice_or_live_and_free_at_once():
    states, req = states_and_request()
    states.attach(req, 0)
    other = states.free_slots[0]
    with pytest.raises(AssertionError, match="a live state slot is held twice"):
        states.check_integrity([req.state_slot, req.state_slot])
    with pytest.raises(AssertionError, match="a live state slot is in the free list"):
        states.check_integrity([req.state_slot, other])


def test_a_readmitted_request_keeps_its_plan_and_is_observed_once():
    """Planned once: re-admitted after preemption it keeps the positions it had (chunks already cut there, saves
    already listed), and the planner does not count the same prompt as a second request."""
    states, req = states_and_request()
    states.attach(req, 0)
    assert req.checkpoint_positions == [8] and len(states.planner.recent) == 1
    req.checkpoint_positions = [4, 12]  # as planned under other traffic: the planner would now say [8]
    states.release(req)
    states.attach(req, 0)
    assert req.checkpoint_positions == [4, 12] and len(states.planner.recent) == 1


def test_a_planned_position_inside_a_block_is_never_saved():
    """A state is filed under the hash of the block it ends: one inside a block would be found by a prompt that
    shares only the blocks before it."""
    states, req = states_and_request()
    states.attach(req, 0)
    req.checkpoint_positions = [6, 8]
    states.plan_saves(req, 6)
    assert states.ops.save == [] and req.saved_checkpoints == [] and states.stats.num_saved == 0
    states.plan_saves(req, 8)
    assert states.ops.save == [(req.state_slot, 0)] and req.saved_checkpoints == [8]


def test_a_checkpoint_holds_the_conv_window_in_the_model_dtype_and_the_state_in_float32():
    conv_shape, ssm_shape = (2, 3, 4), (2, 5, 6, 7)  # per slot: [linear_layers, ...]
    checkpoint_bytes = 2 * 3 * 4 * 2 + 2 * 5 * 6 * 7 * 4  # bfloat16 conv, float32 state: 48 + 1680
    tensors = StateTensors((conv_shape, ssm_shape), 3, 2 * checkpoint_bytes + 1, torch.bfloat16, "cpu")
    assert (tensors.checkpoint_bytes, tensors.num_checkpoints) == (checkpoint_bytes, 2)
    assert tensors.conv.shape == (2, 3, 3, 4) and tensors.conv.dtype == torch.bfloat16
    assert tensors.ckpt_ssm.shape == (2, 2, 5, 6, 7) and tensors.ckpt_ssm.dtype == torch.float32


def test_before_forward_zeroes_both_states_of_a_fresh_slot_and_loads_both_of_a_resumed_one():
    tensors = StateTensors(((1, 2, 3), (1, 2, 2, 2)), 2, 4 * 56, torch.float32, "cpu")  # 4 checkpoints
    tensors.conv.fill_(5.0)
    tensors.ssm.fill_(5.0)  # slots 0 and 1 hold an earlier request's states
    tensors.ckpt_conv[:, 3].fill_(7.0)
    tensors.ckpt_ssm[:, 3].fill_(7.0)
    tensors.before_forward(StateOps(zero=[0], load=[(3, 1)]))
    assert tensors.conv[:, 0].eq(0).all() and tensors.ssm[:, 0].eq(0).all()
    assert tensors.conv[:, 1].eq(7).all() and tensors.ssm[:, 1].eq(7).all()


def test_after_forward_saves_both_states_of_a_slot_into_its_checkpoint():
    tensors = StateTensors(((1, 2, 3), (1, 2, 2, 2)), 2, 4 * 56, torch.float32, "cpu")  # 4 checkpoints
    tensors.conv[:, 1].fill_(5.0)
    tensors.ssm[:, 1].fill_(6.0)
    tensors.after_forward(StateOps(save=[(1, 2)]))
    assert tensors.ckpt_conv[:, 2].eq(5).all() and tensors.ckpt_ssm[:, 2].eq(6).all()
    assert tensors.ckpt_conv[:, [0, 1, 3]].eq(0).all() and tensors.ckpt_ssm[:, [0, 1, 3]].eq(0).all()
    tensors.after_forward(None)  # a step of a model without states: nothing to save
