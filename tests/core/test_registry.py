import pytest

from fedseg.errors import RegistryError
from fedseg.methods import list_methods
from fedseg.registry import Registry


def test_register_and_get():
    reg: Registry[int] = Registry("thing")
    reg.register("one")(1)
    assert reg.get("one") == 1
    assert "one" in reg and reg.names() == ["one"]


def test_duplicate_and_bad_names_raise():
    reg: Registry[int] = Registry("thing")
    reg.register("one")(1)
    with pytest.raises(RegistryError, match="already registered"):
        reg.register("one")(2)
    with pytest.raises(RegistryError, match="invalid"):
        reg.register("Bad-Name")


def test_unknown_name_suggests_close_matches():
    reg: Registry[int] = Registry("method")
    reg.register("fedavg")(1)
    reg.register("fedprox")(2)
    with pytest.raises(RegistryError, match="Did you mean fedavg") as e:
        reg.get("fedavgg")
    assert "Available: fedavg, fedprox" in str(e.value)


def test_builtin_methods_registered():
    assert {"fedavg", "local", "centralized"} <= set(list_methods())
    assert list_methods("fed*")[0].startswith("fed")
