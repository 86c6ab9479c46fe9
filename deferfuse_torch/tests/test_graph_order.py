"""The reordering of optimizer-like graphs (deferfuse_torch/graph_order.py): it must keep
every result, every read of an input before the copy into it, and the order of random ops."""

import operator

import torch
import torch.fx

from deferfuse_torch import graph_order

aten = torch.ops.aten


def order_of(graph):
    return {n: i for i, n in enumerate(graph.nodes)}


def test_a_copy_into_an_input_stays_after_its_readers_and_before_later_ones():
    g = torch.fx.Graph()
    x = g.placeholder("x")
    early = g.call_function(aten.add.Tensor, (x, 3))
    new = g.call_function(aten.mul.Tensor, (x, 2))
    copy = g.call_function(aten.copy_.default, (x, new))
    late = g.call_function(aten.add.Tensor, (x, 1))  # reads x after the copy
    g.output((late, early))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    inp = torch.ones(3)
    want = gm(inp.clone())
    graph_order.chain_order(g)
    gm.recompile()
    pos = order_of(g)
    assert pos[early] < pos[copy] < pos[late] and pos[new] < pos[copy]
    for got, w in zip(gm(inp.clone()), want):
        torch.testing.assert_close(got, w)


def test_each_copy_follows_right_after_the_value_it_copies():
    g = torch.fx.Graph()
    a, b = g.placeholder("a"), g.placeholder("b")
    # Horizontal, as a foreach optimizer step: both updates, then both copies.
    a1, b1 = g.call_function(aten.mul.Tensor, (a, 2)), g.call_function(aten.mul.Tensor, (b, 2))
    a2, b2 = g.call_function(aten.add.Tensor, (a1, 1)), g.call_function(aten.add.Tensor, (b1, 1))
    ca = g.call_function(aten.copy_.default, (a, a2))
    cb = g.call_function(aten.copy_.default, (b, b2))
    g.output(())
    graph_order.chain_order(g)
    names = [n for n in g.nodes if n.op == "call_function"]
    assert names == [a1, a2, ca, b1, b2, cb]


def test_random_ops_keep_their_order():
    g = torch.fx.Graph()
    x = g.placeholder("x")
    r1 = g.call_function(aten.rand_like.default, (x,))
    r2 = g.call_function(aten.rand_like.default, (x,))
    # The output uses the second draw first; the draws must still run in their order.
    g.output((g.call_function(aten.add.Tensor, (r2, r1)),))
    graph_order.chain_order(g)
    pos = order_of(g)
    assert pos[r1] < pos[r2]


def test_foreach_ops_become_one_op_per_tensor_with_the_same_values():
    g2 = torch.fx.Graph()
    a, b = g2.placeholder("a"), g2.placeholder("b")
    fe = g2.call_function(aten._foreach_addcmul.Scalar, ([a, b], [a, b], [b, a], 0.5))
    g2.output((g2.call_function(operator.getitem, (fe, 0)),
               g2.call_function(operator.getitem, (fe, 1))))
    gm = torch.fx.GraphModule(torch.nn.Module(), g2)
    x, y = torch.randn(3), torch.randn(3)
    want = gm(x, y)
    assert graph_order.split_foreach(g2)
    gm.recompile()
    assert not any("foreach" in str(n.target) for n in g2.nodes)
    for got, w in zip(gm(x, y), want):
        torch.testing.assert_close(got, w)
