from importlib import metadata

from gptlite.backend import compile_cache


def test_the_cache_folder_names_tensorflow_s_version_when_it_came_as_tensorflow_cpu(monkeypatch, tmp_path):
    # `pip install tensorflow-cpu` installs the module `tensorflow` under another distribution's name.
    def version(name):
        if name != "tensorflow-cpu":
            raise metadata.PackageNotFoundError(name)
        return "9.8.7"

    monkeypatch.setattr(metadata, "version", version)
    monkeypatch.setattr(metadata, "packages_distributions", lambda: {"tensorflow": ["tensorflow-cpu"]})
    monkeypatch.setattr(compile_cache, "_chosen", compile_cache._chosen)
    monkeypatch.setenv("TF_XLA_FLAGS", "")
    compile_cache.use(tmp_path, backend="tensorflow")
    folder = compile_cache.tensorflow_folder()
    assert folder.parent == tmp_path and folder.name.startswith("tensorflow-9.8.7-")


def test_the_cache_folder_still_comes_when_no_distribution_names_the_backend(monkeypatch, tmp_path):
    def version(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", version)
    monkeypatch.setattr(metadata, "packages_distributions", lambda: {})
    monkeypatch.setattr(compile_cache, "_chosen", compile_cache._chosen)
    monkeypatch.setenv("TF_XLA_FLAGS", "")
    compile_cache.use(tmp_path, backend="tensorflow")
    assert compile_cache.tensorflow_folder().name.startswith("tensorflow-unknown-")
