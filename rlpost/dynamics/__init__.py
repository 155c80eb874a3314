"""Bidirectional diffusion rollouts of dynamical systems with a round-trip error signal.

Import the submodule you need; nothing heavy is imported here.

Data (NumPy only):

* ``solvers``: float64 pseudo-spectral steppers (integrating-factor RK4, ETDRK4) on periodic grids.
* ``systems``: the named systems (``kdv1d``, ``ks1d``, ``ns2d``), their trajectory generators and
  the forward-then-backward ``reversibility_error`` check. ``get_system(name)``, ``list_systems()``.
* ``data``: ``load`` / ``load_all`` build each system's train / validation / test / ood splits once
  through a tensorflow-datasets builder (array_record) and read them back; input validation
  (``check_trajectories``, ``check_depth``).
* ``well``: ``load_well`` reads trajectories from The Well's HDF5 layout (needs h5py).

Model and rollouts (JAX):

* ``model``: the conditional velocity network (state, direction flag, flow time; FiLM) and an
  optional autoencoder for latent diffusion.
* ``train``: flow matching on (x_t -> x_{t+1}, +1) and (x_{t+1} -> x_t, -1) pairs; direction
  specialists from the same code (``directions="forward"|"backward"``).
* ``rollout``: jitted autoregressive rollouts (``lax.scan``), deterministic and stochastic
  samplers, and ``round_trip`` (C_i at several depths); any exact stepper can stand in for the
  model. Trust metrics live in ``rlpost.eval.trust``.

A trajectory array is ``float32 [N, T, *S, F]``: N trajectories, T frames, spatial dims S
(``[X]`` in 1D, ``[H, W]`` in 2D) and F fields last.
"""
