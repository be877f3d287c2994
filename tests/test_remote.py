"""course_utils.classroom.remote: what travels between the learner's kernel and the grading process."""
from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from course_utils.classroom import remote


def roundtrip(obj):
    arrays: list = []
    tree = remote.encode(obj, arrays)
    buffer = io.BytesIO()
    np.savez(buffer, **{f"a{i}": a for i, a in enumerate(arrays)})
    buffer.seek(0)
    with np.load(buffer, allow_pickle=False) as data:
        return remote.decode(tree, {k: data[k] for k in data.files})


def test_data_travels_with_its_types_dtypes_and_layout():
    t = torch.randn(3, 4).t()                                         # a non-contiguous view
    value = {"a": [1, 2.5, True, None, "s"], "b": (np.float32(1.5), np.arange(6).reshape(2, 3)),
             "t": t, "h": torch.randn(2).to(torch.bfloat16), "d": torch.float16, 3: Ellipsis}
    got = roundtrip(value)
    assert got["a"] == [1, 2.5, True, None, "s"] and isinstance(got["b"], tuple)
    assert isinstance(got["b"][0], np.float32) and np.array_equal(got["b"][1], value["b"][1])
    assert torch.equal(got["t"], t) and got["t"].stride() == t.stride() and not got["t"].is_contiguous()
    assert got["h"].dtype == torch.bfloat16 and torch.equal(got["h"], value["h"])
    assert got["d"] is torch.float16 and got[3] is Ellipsis


def test_objects_that_are_not_data_stay_behind_as_handles():
    class Anything:
        def __eq__(self, other):
            return True

    got = roundtrip(Anything())
    assert isinstance(got, remote.RemoteObject) and got._type_name == "Anything"
    lying = roundtrip((np.ones(3) * 2).view(type("Liar", (np.ndarray,), {"__eq__": lambda s, o: True})))
    assert type(lying) is np.ndarray                                  # subclasses arrive as plain arrays


def test_in_place_changes_are_found_in_lists_and_gradients():
    grads = [torch.ones(3), torch.zeros(2)]
    p = torch.zeros(2, requires_grad=True)
    snapshot = remote._snapshot((grads, p), {})
    grads[0].mul_(2)
    p.grad = torch.ones(2)
    changes = remote._mutations(snapshot, (grads, p), {})
    assert [(path, what) for path, what, _ in changes] == [(["args", 0, 0], "value"), (["args", 1], "grad")]


@pytest.mark.parametrize("name", ["NotImplementedError", "NotAttempted"])
def test_a_stub_in_the_kernel_is_not_attempted_here(name):
    assert isinstance(remote.remote_error(name, "stub"), NotImplementedError)
    assert not isinstance(remote.remote_error("ValueError", "x"), NotImplementedError)


def test_a_write_past_a_view_comes_back_with_the_whole_storage():
    buffer = torch.zeros(4, 6)
    out = buffer[1:3, 1:4]                                            # a view into a padded buffer
    snapshot = remote._snapshot((out,), {})
    buffer[3, 5] = 7.0                                                # a store past the view's edge
    out.fill_(1.0)
    changes = remote._mutations(snapshot, (out,), {})
    assert [(path, what) for path, what, _ in changes] == [(["args", 0], "storage")]
    mine = torch.zeros(4, 6)
    mine_view = mine[1:3, 1:4]
    arrays: list = []
    trees = [[p, w, remote.encode(v, arrays)] for p, w, v in changes]
    remote._write_back(trees, (mine_view,), {}, {f"a{i}": a for i, a in enumerate(arrays)}, None)
    assert torch.equal(mine, buffer)


def test_a_by_hand_spec_travels_to_the_kernel_as_itself():
    """call_learner hands the remote proxy a ByHand (not a list of names); the request carries it whole."""
    import pickle

    from course_utils.classroom.checking import call_learner
    from course_utils.classroom.forbidden import ByHand

    sent = {}

    class Session:
        def request(self, request):
            sent.update(request)
            return {"value": remote.encode(2.5, []), "hit": None, "mutated": []}, {}

    spec = ByHand(ops=("@matmul",), modules=("course_utils.vae",), names=("torch.nn.functional.mse_loss",))
    assert call_learner("f", remote.RemoteObject(Session(), name="f"), (1.0,), by_hand=spec) == 2.5
    assert sent["forbidden"] == spec and pickle.loads(pickle.dumps(sent["forbidden"])) == spec
    call_learner("f", remote.RemoteObject(Session(), name="f"), (1.0,), forbidden=["torch.nn.functional.mse_loss"])
    assert sent["forbidden"].names == ("torch.nn.functional.mse_loss",)
