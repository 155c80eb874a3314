"""The Well's HDF5 layout: values, channel names, selection, slicing and clear errors."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from rlpost.dynamics.well import load_well

h5py = pytest.importorskip("h5py")

N, T, X, Y = 3, 5, 4, 6  # non-square so that swapped spatial axes are caught


def _values(rng, *tail):
  return rng.normal(size=(N, T, X, Y, *tail)).astype(np.float32)


def _write(path, *, drop_group=None, t1_steps=T, nan=False, spatial_dims=("x", "y")):
  """A tiny 2D file in The Well's layout; returns the arrays written."""
  rng = np.random.default_rng(0)
  arrays = {"density": _values(rng), "pressure": _values(rng), "velocity": _values(rng, 2),
            "stress": _values(rng, 2, 2), "mask": (rng.normal(size=(X, Y)) > 0).astype(np.float32),
            "profile": rng.normal(size=(N, T, X)).astype(np.float32)}
  if nan:
    arrays["density"][1, 2, 0, 0] = np.nan
  if t1_steps != T:
    arrays["velocity"] = arrays["velocity"][:, :t1_steps]
  with h5py.File(path, "w") as f:
    f.attrs.update(dataset_name="toy", grid_type="cartesian", n_spatial_dims=2, n_trajectories=N,
                   simulation_parameters=["Re"], Re=100.0)
    dims = f.create_group("dimensions")
    dims.attrs["spatial_dims"] = list(spatial_dims)
    dims.create_dataset("time", data=np.linspace(0, 1, T, dtype=np.float32))
    dims.create_dataset("x", data=np.linspace(0, 1, X, dtype=np.float32))
    dims.create_dataset("y", data=np.linspace(0, 1, Y, dtype=np.float32))
    bc = f.create_group("boundary_conditions").create_group("x_periodic")
    bc.attrs.update(bc_type="periodic", associated_dims=["x"])
    sc = f.create_group("scalars")
    sc.attrs["field_names"] = ["Re"]
    sc.create_dataset("Re", data=np.float32(100.0)).attrs.update(time_varying=False,
                                                                 sample_varying=False)

    def field(group, name, dim_varying=(True, True), time_varying=True, sample_varying=True):
      ds = f[group].create_dataset(name, data=arrays[name])
      ds.attrs.update(dim_varying=np.array(dim_varying), time_varying=time_varying,
                      sample_varying=sample_varying)

    for g, names in (("t0_fields", ["density", "pressure", "mask", "profile"]),
                     ("t1_fields", ["velocity"]), ("t2_fields", ["stress"])):
      if g == drop_group:
        continue
      f.create_group(g).attrs["field_names"] = names
    if drop_group != "t0_fields":
      field("t0_fields", "density")
      field("t0_fields", "pressure")
      field("t0_fields", "mask", time_varying=False, sample_varying=False)
      field("t0_fields", "profile", dim_varying=(True, False))
    if drop_group != "t1_fields":
      field("t1_fields", "velocity")
    if drop_group != "t2_fields":
      field("t2_fields", "stress")
  return arrays


@pytest.fixture
def well_file(tmp_path):
  path = tmp_path / "toy.hdf5"
  return path, _write(path)


def test_default_loads_time_varying_fields_with_component_names(well_file):
  path, a = well_file
  x, names = load_well(path)
  assert names == ["density", "pressure", "profile", "velocity_x", "velocity_y", "stress_xx",
                   "stress_xy", "stress_yx", "stress_yy"]
  assert x.shape == (N, T, X, Y, 9) and x.dtype == np.float32 and x.flags.c_contiguous
  np.testing.assert_array_equal(x[..., 0], a["density"])
  np.testing.assert_array_equal(x[..., 1], a["pressure"])
  np.testing.assert_array_equal(x[..., 2], np.broadcast_to(a["profile"][..., None], (N, T, X, Y)))
  np.testing.assert_array_equal(x[..., 3], a["velocity"][..., 0])
  np.testing.assert_array_equal(x[..., 4], a["velocity"][..., 1])
  np.testing.assert_array_equal(x[..., 6], a["stress"][..., 0, 1])
  np.testing.assert_array_equal(x[..., 7], a["stress"][..., 1, 0])


def test_select_fields_components_and_constants(well_file):
  path, a = well_file
  x, names = load_well(str(path), fields=["velocity_y", "density", "mask"])
  assert names == ["velocity_y", "density", "mask"]
  np.testing.assert_array_equal(x[..., 0], a["velocity"][..., 1])
  np.testing.assert_array_equal(x[..., 1], a["density"])
  np.testing.assert_array_equal(x[..., 2], np.broadcast_to(a["mask"], (N, T, X, Y)))
  x, names = load_well(path, fields="velocity")
  assert names == ["velocity_x", "velocity_y"]
  np.testing.assert_array_equal(x, a["velocity"])


def test_max_trajectories_and_time_slice(well_file):
  path, a = well_file
  x, _ = load_well(path, fields=["density"], max_trajectories=2, time_slice=slice(1, None, 2))
  np.testing.assert_array_equal(x[..., 0], a["density"][:2, 1::2])
  x, _ = load_well(path, fields=["mask", "stress"], max_trajectories=10, time_slice=(0, 2))
  assert x.shape == (N, 2, X, Y, 5)
  np.testing.assert_array_equal(x[..., 1:].reshape(N, 2, X, Y, 2, 2), a["stress"][:, :2])
  with pytest.raises(ValueError, match="step must be positive"):
    load_well(path, time_slice=slice(None, None, -1))
  with pytest.raises(ValueError, match="selects no frames"):
    load_well(path, time_slice=(3, 3))
  with pytest.raises(ValueError, match="time_slice must be"):
    load_well(path, time_slice=3)
  for bad in (0, -1, 1.5, True):
    with pytest.raises(ValueError, match="max_trajectories"):
      load_well(path, max_trajectories=bad)


def test_one_dimensional_file(tmp_path):
  path = tmp_path / "line.h5"
  u = np.arange(2 * 3 * 8, dtype=np.float32).reshape(2, 3, 8, 1)
  with h5py.File(path, "w") as f:
    f.attrs.update(n_spatial_dims=1, n_trajectories=2)
    dims = f.create_group("dimensions")
    dims.attrs["spatial_dims"] = ["x"]
    dims["time"], dims["x"] = np.arange(3.0), np.arange(8.0)
    f.create_group("t0_fields").attrs["field_names"] = []
    f.create_group("t1_fields").attrs["field_names"] = ["velocity"]
    f.create_group("t2_fields").attrs["field_names"] = []
    f["t1_fields"]["velocity"] = u
  x, names = load_well(path)
  assert names == ["velocity_x"]
  np.testing.assert_array_equal(x, u)


def test_missing_file_and_not_hdf5(tmp_path):
  with pytest.raises(FileNotFoundError, match="nope.hdf5: no such file"):
    load_well(tmp_path / "nope.hdf5")
  text = tmp_path / "notes.hdf5"
  text.write_text("not hdf5")
  with pytest.raises(ValueError, match="notes.hdf5: not an HDF5 file"):
    load_well(text)


@pytest.mark.parametrize("group", ["t1_fields", "t2_fields", "t0_fields"])
def test_missing_group(tmp_path, group):
  path = tmp_path / "partial.hdf5"
  _write(path, drop_group=group)
  with pytest.raises(ValueError, match=rf"partial.hdf5: not in The Well's layout, missing "
                                       rf"group\(s\) \['{group}'\]"):
    load_well(path)


def test_missing_spatial_dims_and_listed_dataset(tmp_path):
  path = tmp_path / "toy.hdf5"
  _write(path, spatial_dims=("x", "z"))
  with pytest.raises(ValueError, match="missing dataset 'dimensions/z'"):
    load_well(path)
  path = tmp_path / "toy2.hdf5"
  _write(path)
  with h5py.File(path, "a") as f:
    del f["t1_fields"]["velocity"]
  with pytest.raises(ValueError, match=r"t1_fields lists field 'velocity' but has no dataset "
                                       r"'t1_fields/velocity'"):
    load_well(path)


def test_mismatched_shapes_name_the_dataset(tmp_path):
  path = tmp_path / "bad.hdf5"
  _write(path, t1_steps=T - 1)
  with pytest.raises(ValueError, match=r"bad.hdf5: dataset 't1_fields/velocity' has shape "
                                       r"\(3, 4, 4, 6, 2\), expected \(3, 5, 4, 6, 2\)"):
    load_well(path)
  # Fields that are not requested are not read.
  x, _ = load_well(path, fields=["density"])
  assert x.shape == (N, T, X, Y, 1)


def test_nan_names_dataset_and_trajectory(tmp_path):
  path = tmp_path / "nan.hdf5"
  _write(path, nan=True)
  with pytest.raises(ValueError, match=r"nan.hdf5: dataset 't0_fields/density' contains NaN or "
                                       r"inf \(trajectory 1, frame 2 of the file\)"):
    load_well(path)
  x, _ = load_well(path, fields=["density"], max_trajectories=1)  # the NaN is not read
  assert np.isfinite(x).all()


def test_unknown_field_lists_the_available_ones(well_file):
  path, _ = well_file
  with pytest.raises(ValueError, match=r"unknown field 'vorticity'; fields: \['density', "
                                       r"'mask', 'pressure', 'profile', 'stress', 'velocity'\]"):
    load_well(path, fields=["vorticity"])


def test_missing_h5py_is_a_clear_error(well_file, monkeypatch):
  monkeypatch.setitem(sys.modules, "h5py", None)
  with pytest.raises(ImportError, match=r"needs h5py.*rlpost\[well\]"):
    load_well(well_file[0])
