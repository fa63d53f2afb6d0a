from tests.kernels.tolerance import TOL, DTYPES


def test_table_covers_every_dtype():
    assert set(TOL) == set(DTYPES)
