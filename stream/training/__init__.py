"""Private training on the shared per-user ledger (Feldman & Zrnic, Section 5 and Appendix A).

* :mod:`~renyi_stream.stream.training.models`: multinomial logistic regression and a one-hidden-layer ReLU
  MLP with per-example gradient norms computed without materialising per-example gradients;
* :mod:`~renyi_stream.stream.training.per_example`: what every model returns from a pass (norm bounds and
  a weighted sum) and the bounded row norms they are made of;
* :mod:`~renyi_stream.stream.training.cnn`: Opacus's MNIST CNN (the paper's network), per-example norms
  per layer by whichever exact method costs less (materialised conv gradients, Gram identity for
  the dense layers) and the clipped sum as a second, weighted pass;
* :mod:`~renyi_stream.stream.training.dpgd`: Algorithms 6 and 7 (private gradient descent, with and without
  individual filtering) in one implementation;
* :mod:`~renyi_stream.stream.training.budget`: the ledger as seen by a training run (arrays per row);
* :mod:`~renyi_stream.stream.training.stopping`: Appendix A's stopping rule with private accuracy queries;
* :mod:`~renyi_stream.stream.training.normaliser`: what the update divides by (public, or a noisy user count);
* :mod:`~renyi_stream.stream.training.keyed_noise`: a run's noise derived from the curator's key (released once);
* :mod:`~renyi_stream.stream.training.idx`: the MNIST IDX file format.

NumPy on CPU, CuPy on GPU (``renyi_stream.stream.xp``), one code path.
"""
