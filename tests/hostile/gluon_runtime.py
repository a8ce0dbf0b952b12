"""Imports Gluon's private runtime module, which builds compiler sources from Python objects."""
import torch
from triton.experimental.gluon import _runtime
from triton.experimental import gluon


@gluon.jit
def _k(x_ptr):
    pass


def kernel_fn(x):
    _runtime.GluonASTSource
    return x
