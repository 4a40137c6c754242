"""The parts of `bazel run //:install` (install/BUILD): the whole library as
one shared object and one static archive, and the headers it may install."""

load("@bazel_tools//tools/cpp:toolchain_utils.bzl", "find_cpp_toolchain")

def _libraries(deps):
    """The LibraryToLinks and user link flags of deps, transitively."""
    libraries, flags = [], []
    for dep in deps:
        for linker_input in dep[CcInfo].linking_context.linker_inputs.to_list():
            libraries.extend(linker_input.libraries)
            for flag in linker_input.user_link_flags:
                if flag not in flags:
                    flags.append(flag)
    return libraries, flags

def _libraries_impl(ctx):
    cc_toolchain = find_cpp_toolchain(ctx)
    libraries, flags = _libraries(ctx.attr.deps)
    archives = []
    for lib in libraries:
        # Position-independent members: they go into the shared object, and
        # the archive then links into PIE executables (Debian's default) too.
        archive = lib.pic_static_library or lib.static_library
        if archive and archive not in archives:
            archives.append(archive)

    # Every member of every archive, alwayslink (.lo) or not, relinked into
    # one object: a program that uses any symbol of libloom.a gets all of it,
    # the op and kernel registrations (static initialisers nothing refers
    # to) included, without --whole-archive on its side; and libloom.so,
    # linked from the same object, exports the whole API (a cc_binary with
    # linkshared links only the archive members something refers to).
    merged = ctx.actions.declare_file("_" + ctx.label.name + "/loom.pic.o")
    static = ctx.actions.declare_file(ctx.attr.static_library)
    args = ctx.actions.args()
    args.add(cc_toolchain.ld_executable)
    args.add(cc_toolchain.ar_executable)
    args.add(merged)
    args.add(static)
    args.add_all(archives)
    ctx.actions.run_shell(
        inputs = depset(archives, transitive = [cc_toolchain.all_files]),
        outputs = [merged, static],
        arguments = [args],
        command = 'ld="$1" ar="$2" obj="$3" lib="$4"; shift 4; ' +
                  '"$ld" -r -o "$obj" --whole-archive "$@" --no-whole-archive && ' +
                  'rm -f "$lib" && "$ar" rcsD "$lib" "$obj"',
        mnemonic = "LoomStaticLibrary",
        progress_message = "Merging %d archives into %s" % (len(archives), static.short_path),
    )

    feature_configuration = cc_common.configure_features(
        ctx = ctx,
        cc_toolchain = cc_toolchain,
        requested_features = ctx.features,
        unsupported_features = ctx.disabled_features,
    )
    linked = cc_common.link(
        actions = ctx.actions,
        feature_configuration = feature_configuration,
        cc_toolchain = cc_toolchain,
        compilation_outputs = cc_common.create_compilation_outputs(
            objects = depset([merged]),
            pic_objects = depset([merged]),
        ),
        user_link_flags = flags + ["-Wl,-soname," + ctx.attr.soname],
        name = ctx.attr.soname[len("lib"):-len(".so")],
        output_type = "dynamic_library",
    )
    shared = linked.library_to_link.resolved_symlink_dynamic_library or linked.library_to_link.dynamic_library

    link_flags = ctx.actions.declare_file(ctx.label.name + "_link_flags.txt")
    ctx.actions.write(link_flags, "".join([f + "\n" for f in flags]))
    return [
        DefaultInfo(
            files = depset([shared, static, link_flags]),
            runfiles = ctx.runfiles(files = [shared, static, link_flags]),
        ),
        OutputGroupInfo(
            shared_library = depset([shared]),
            static_library = depset([static]),
            link_flags = depset([link_flags]),
        ),
    ]

loom_libraries = rule(
    implementation = _libraries_impl,
    doc = "deps' transitive libraries, every object of them, as one shared object and one static " +
          "archive, and the system libraries they link (user link flags, one a line).",
    attrs = {
        "deps": attr.label_list(providers = [CcInfo]),
        "soname": attr.string(mandatory = True),
        "static_library": attr.string(mandatory = True),
        "_cc_toolchain": attr.label(default = "@bazel_tools//tools/cpp:current_cc_toolchain"),
    },
    fragments = ["cpp"],
    toolchains = ["@bazel_tools//tools/cpp:toolchain_type"],
)

def _headers_impl(ctx):
    headers = {}
    for dep in ctx.attr.deps:
        for h in dep[CcInfo].compilation_context.headers.to_list():
            # loom's own headers, sources and generated (.pb.h), not the
            # _virtual_includes copies nor other repositories' (Eigen).
            if h.owner.workspace_name == "" and "/_virtual_includes/" not in h.path:
                headers[h.short_path] = h
    headers = [headers[path] for path in sorted(headers)]
    manifest = ctx.actions.declare_file(ctx.label.name + ".txt")
    ctx.actions.write(manifest, "".join([h.short_path + "\n" for h in headers]))
    return [DefaultInfo(files = depset([manifest]), runfiles = ctx.runfiles(files = headers + [manifest]))]

loom_headers = rule(
    implementation = _headers_impl,
    doc = "Lists (and carries as runfiles) every header of deps in this repository, by repository path.",
    attrs = {"deps": attr.label_list(providers = [CcInfo])},
)
