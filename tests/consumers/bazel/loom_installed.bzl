"""@loom from an installed tree: new_local_repository with the prefix taken
from the environment (LOOM_PREFIX, e.g. `bazel build --repo_env=LOOM_PREFIX=...`),
since a WORKSPACE cannot read it and the prefix is not known in advance."""

def _loom_installed_impl(rctx):
    prefix = rctx.os.environ.get("LOOM_PREFIX", "")
    if not prefix:
        fail("set LOOM_PREFIX to an installed loom (in loom's workspace: bazel run //:install -- PREFIX)")
    for part in ["include/loom/loom.h", "lib/libloom.so", "lib/libloom.a"]:
        if not rctx.path(prefix + "/" + part).exists:
            fail("LOOM_PREFIX=%s holds no %s: not an installed loom (bazel run //:install -- PREFIX)" % (prefix, part))
    rctx.symlink(prefix + "/include", "include")
    rctx.symlink(prefix + "/lib", "lib")
    rctx.symlink(rctx.attr.build_file, "BUILD.bazel")

loom_installed = repository_rule(
    implementation = _loom_installed_impl,
    attrs = {"build_file": attr.label(mandatory = True, allow_single_file = True)},
    environ = ["LOOM_PREFIX"],
    local = True,
)
