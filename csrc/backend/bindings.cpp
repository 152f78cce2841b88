// The Python module smdccl._C: the backend factory and introspection. The
// only file (with backend/) that includes torch's Python headers.
#include <cstdint>
#include <torch/csrc/utils/pybind.h>
#include <torch/python.h>

#include <cctype>
#include <map>

#include "algorithms/gpu_tuning.h"
#include "algorithms/plan.h"
#include "algorithms/tuning.h"
#include "backend/backend.h"
#include "common/env.h"
#include "common/error.h"
#include "common/exit_fence.h"
#include "kernels/cpu/reduce.h"
#include "transport/nccl_library.h"
#ifdef SMDCCL_WITH_CUDA
#include "transport/cuda/cuda_check.h"
#endif

namespace py = pybind11;

namespace smdccl::env {
SMDCCL_ENV_CHOICE(kCompression, "SMDCCL_COMPRESSION", "none", kCompressionNames,
                  "Fewer bits between nodes for float32 reductions, every addition float32: fp16 "
                  "or bf16 (allreduce / reduce_scatter; the cast fused into the send and the "
                  "receive-and-reduce), int8 (allreduce, reduce_scatter SUM/AVG on uniform nodes: "
                  "block-wise int8 "
                  "with a float32 scale per 128 values, quantized once per level; the rest full "
                  "precision). Per group: pg_options={'compression': 'fp16'}.");
SMDCCL_ENV_INT(kCompressionIntra, "SMDCCL_COMPRESSION_INTRA", 0, 0, 1,
               "1: compress inside nodes too (shared memory), not only between nodes.");
}  // namespace smdccl::env

namespace {

// What torch says of a group at its creation (c10d's backend options),
// filled in by python/smdccl/_registration.py.
struct GroupParams {
  int rank = 0;
  int size = 1;
  std::string groupName;
  std::vector<int> globalRanks;
  double timeoutSeconds = 1800;
  std::string masterAddr;
  int worldSize = 0;
  std::string compression;    // pg_options' ("": SMDCCL_COMPRESSION)
  int compressionIntra = -1;  // pg_options' (-1: SMDCCL_COMPRESSION_INTRA)
};

c10::intrusive_ptr<smdccl::SmdcclBackend> createBackend(
    const c10::intrusive_ptr<::c10d::Store>& store, const GroupParams& p) {
  const int rank = p.rank, size = p.size;
  const std::string& compression = p.compression;
  TORCH_CHECK_VALUE(size >= 1 && rank >= 0 && rank < size, "smdccl: rank ", rank,
                    " is out of range for a group of ", size);
  smdccl::checkEnvironment();  // before any rendezvous: a bad value fails here, on every rank
  smdccl::BackendConfig cfg;
  cfg.rank = rank;
  cfg.size = size;
  cfg.groupName = p.groupName;
  cfg.globalRanks = p.globalRanks;
  cfg.timeout = std::chrono::milliseconds(static_cast<int64_t>(p.timeoutSeconds * 1000.0));
  cfg.masterAddr = p.masterAddr;
  cfg.worldSize = p.worldSize;
  const smdccl::Compression chosen = smdccl::parseCompression(
      compression.empty() ? smdccl::envString(smdccl::env::kCompression) : compression,
      "SMDCCL_COMPRESSION or pg_options['compression']");
  cfg.wire = chosen.wire;
  cfg.int8 = chosen.int8;
  cfg.wireIntra = p.compressionIntra >= 0 ? p.compressionIntra != 0
                                          : smdccl::envInt(smdccl::env::kCompressionIntra) != 0;
  py::gil_scoped_release nogil;  // construction rendezvouses through the store
  return c10::make_intrusive<smdccl::SmdcclBackend>(store, std::move(cfg));
}

// smdccl's errors as Python's: bad input is a ValueError.
void translateErrors() {
  py::register_local_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const smdccl::InvalidArgument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const c10::ValueError& e) {
      PyErr_SetString(PyExc_ValueError, e.what_without_backtrace());
    } catch (const c10::Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
    } catch (const smdccl::CommError& e) { PyErr_SetString(PyExc_RuntimeError, e.what()); }
  });
}

// The backend class: what a group tells of itself.
void bindBackend(py::module_& m) {
  py::class_<smdccl::SmdcclBackend, ::c10d::Backend, c10::intrusive_ptr<smdccl::SmdcclBackend>>(
      m, "SmdcclBackend")
      .def_property_readonly("topology", &smdccl::SmdcclBackend::describeTopology,
                             "How the group's ranks are spread over nodes")
      .def_property_readonly("local_ranks", &smdccl::SmdcclBackend::localRanks,
                             "Group ranks that share this rank's node")
      .def_property_readonly("fused_allreduces", &smdccl::SmdcclBackend::fusedAllreduces,
                             "Async allreduces that ran fused with others (SMDCCL_FUSION_MB)")
      .def_property_readonly("fused_collectives", &smdccl::SmdcclBackend::fusedCollectives,
                             "Collectives that carried fused allreduces")
      .def_property_readonly(
          "compression", &smdccl::SmdcclBackend::compression,
          "What float32 reductions travel as between nodes: fp32, fp16, bf16 or int8")
      .def_property_readonly(
          "compressed_hops", &smdccl::SmdcclBackend::compressesSomeHop,
          "Whether float32 reductions put fewer bits on some hop of the group "
          "(it spans nodes, or compression_intra; int8: several nodes of one size); where not, "
          "nothing is rounded")
      .def("_int8_feedback_next", &smdccl::SmdcclBackend::int8FeedbackNext, py::arg("key"),
           "The next all_reduce or reduce_scatter_tensor this thread issues carries the int8 "
           "wire's error feedback under `key` (smdccl.ddp.int8_wire_hook uses one per DDP bucket, "
           "smdccl.fsdp.int8_error_feedback an FSDP2 module's). The mark is the thread's, not "
           "the group's: set it right before the call on this group, and -1 after it")
      .def("_int8_feedback_drop", &smdccl::SmdcclBackend::int8FeedbackDrop, py::arg("key"),
           "Ends the int8 residuals kept under `key` (a DDP bucket that a rebuilt bucket layout "
           "replaced); they are freed by the next call that carries a key")
      .def_property_readonly("_int8_feedback_keys", &smdccl::SmdcclBackend::int8FeedbackKeys,
                             "Keys the group holds int8 residuals under, as of its last call "
                             "that carried one")
      .def_property_readonly("progress_cpu_seconds", &smdccl::SmdcclBackend::progressCpuSeconds,
                             "CPU seconds used so far by the group's progress thread (the "
                             "thread that runs async collectives), read after each of its tasks")
      .def_property_readonly(
          "device_copied_bytes",
          [](const smdccl::SmdcclBackend& b) {
            auto [toHost, fromHost] = b.deviceCopiedBytes();
            py::dict d;
            d["to_host"] = toHost;
            d["from_host"] = fromHost;
            return d;
          },
          "Bytes the group's collectives on CUDA tensors copied from the GPU to host memory "
          "and back (PCIe traffic of the staged paths): {'to_host': n, 'from_host': m}")
      .def_property_readonly("pinned_staging_bytes", &smdccl::SmdcclBackend::pinnedStagingBytes,
                             "Pinned host memory the group holds to stage CUDA tensors (see "
                             "SMDCCL_CUDA_PINNED_SHRINK_OPS); 0 for CPU tensors")
      .def_property_readonly("listen_address", &smdccl::SmdcclBackend::listenAddress,
                             "ip:port of this process's TCP listener")
      .def_property_readonly("rejected_connections", &smdccl::SmdcclBackend::rejectedConnections,
                             "Connections this process's listener dropped for a bad handshake")
      // new_group() on a default group bound to a device splits it where the
      // backend supportsSplitting, and has the ranks left out call this (NCCL
      // needs every parent rank in ncclCommSplit). smdccl's child groups
      // rendezvous among their members only: nothing to do.
      .def(
          "perform_nocolor_split", [](smdccl::SmdcclBackend&, const py::object& /*device*/) {},
          py::arg("device"), "A no-op: smdccl's split children need only their members");
}

// What _registration.py calls to make a group, and to end the process.
void bindGroupCreation(py::module_& m) {
  py::class_<GroupParams>(m, "_GroupParams",
                          "What torch says of a group at its creation (for _create_backend)")
      .def(py::init<>())
      .def_readwrite("rank", &GroupParams::rank)
      .def_readwrite("size", &GroupParams::size)
      .def_readwrite("group_name", &GroupParams::groupName)
      .def_readwrite("global_ranks", &GroupParams::globalRanks)
      .def_readwrite("timeout_seconds", &GroupParams::timeoutSeconds)
      .def_readwrite("master_addr", &GroupParams::masterAddr)
      .def_readwrite("world_size", &GroupParams::worldSize)
      .def_readwrite("compression", &GroupParams::compression)
      .def_readwrite("compression_intra", &GroupParams::compressionIntra);
  m.def("_create_backend", &createBackend, py::arg("store"), py::arg("params"));

  // atexit (see common/exit_fence.h): waits for our threads without the GIL.
  m.def("_mark_process_exiting", &smdccl::markProcessExiting,
        py::call_guard<py::gil_scoped_release>());
}

// The SMDCCL_* variables and the settings they make.
void bindSettings(py::module_& m) {
  m.def(
      "env_table",
      [] {
        py::list out;
        for (const auto& v : smdccl::envVars()) {
          py::dict d;
          d["name"] = v.name;
          d["default"] = v.defaultValue;
          d["help"] = v.help;
          d["kind"] = v.kind == smdccl::EnvVar::Kind::Int      ? "int"
                      : v.kind == smdccl::EnvVar::Kind::Number ? "number"
                                                               : "text";
          d["min"] = v.min;
          d["max"] = v.max;
          d["choices"] = v.choices;
          d["declared_in"] = v.declaredIn;
          out.append(d);
        }
        return out;
      },
      "Every SMDCCL_* variable's declaration (name, default, help, kind, min, max, choices, "
      "declared_in), for docs/env.md");
  m.def(
      "cuda_settings", [] { return smdccl::GpuTuning::fromEnv().describe(); },
      "The SMDCCL_CUDA_* settings a CUDA collective would use here (raises ValueError for a "
      "bad value)");

}

// The cost model's view of any group shape (plan.h): the algorithm chosen,
// every estimate, the model. shape: (ranks, nodes, max_local[, uniform]).
std::tuple<std::string, std::map<std::string, double>, std::string> planOf(
    const std::string& collective, double bytes, const py::tuple& shape,
    const std::string& tuneFile, const std::string& compression) {
  smdccl::PlanQuery q;
  if (!smdccl::collectiveFromName(collective, &q.coll))
    throw smdccl::InvalidArgument("unknown collective '" + collective +
                                  "' (allreduce, reduce_scatter, allgather, broadcast, reduce)");
  SMDCCL_CHECK_ARG(shape.size() == 3 || shape.size() == 4,
                   "plan: shape is (ranks, nodes, max_local[, uniform]), got ", shape.size(),
                   " values");
  q.bytes = bytes;
  q.shape = {shape[0].cast<int>(), shape[1].cast<int>(), shape[2].cast<int>(),
             shape.size() == 4 ? shape[3].cast<bool>() : true};
  q.compression = smdccl::parseCompression(compression, "plan's compression");
  smdccl::Tuning t = smdccl::Tuning::fromEnv();
  if (!tuneFile.empty()) t.model = smdccl::CostModel::fromFile(tuneFile);
  smdccl::Plan p = smdccl::planFor(q, t);
  return {p.chosen, p.estimates, p.model};
}

// The cost model and the registered algorithms.
void bindModel(py::module_& m) {
  m.def("plan", &planOf, py::arg("collective"), py::arg("bytes"), py::arg("shape"),
        py::arg("tune_file") = "", py::arg("compression") = "",
        "The cost model's choice for a collective of `bytes` on a group of `shape` (ranks, "
        "nodes, max_local[, uniform=True]): (algorithm, {every algorithm that can run: estimated "
        "seconds}, model description). Honours SMDCCL_ALGO, SMDCCL_TUNE_FILE (or tune_file) and "
        "SMDCCL_PIPELINE_CHUNK_KB; compression: what float32 reductions (SUM) cross nodes as, "
        "none, fp16, bf16 or int8.");

  m.def(
      "algorithms",
      [] {
        std::vector<std::pair<std::string, std::vector<std::string>>> out;
        for (const smdccl::Algorithm* a : smdccl::registeredAlgorithms()) {
          std::vector<std::string> colls;
          for (int k = 0; k < smdccl::kCollectives; ++k)
            if (a->serves(static_cast<smdccl::Collective>(k)))
              colls.push_back(smdccl::collectiveName(static_cast<smdccl::Collective>(k)));
          out.emplace_back(a->name(), colls);
        }
        return out;
      },
      "The registered algorithms, in registration order: [(name, [collectives it runs])]");

}

// How the engine was built and what it found on this machine.
void bindBuild(py::module_& m) {
  m.def(
      "build_info",
      [] {
        std::map<std::string, py::object> out;
#if defined(__clang__)
        out["compiler"] = py::str(std::string("clang ") + __clang_version__);
#elif defined(__GNUC__)
        out["compiler"] = py::str(std::string("gcc ") + __VERSION__);
#else
        out["compiler"] = py::str("unknown");
#endif
#ifdef NDEBUG
        out["build_type"] = py::str("optimized (NDEBUG)");
#else
        out["build_type"] = py::str("debug (assertions on)");
#endif
#ifdef SMDCCL_WITH_CUDA
        out["cuda"] = py::bool_(true);
#else
        out["cuda"] = py::bool_(false);
#endif
        std::string san;
#if defined(__SANITIZE_ADDRESS__)
        san += "address";
#endif
#if defined(SMDCCL_UBSAN)
        san += san.empty() ? "undefined" : ",undefined";
#endif
        out["sanitizers"] = py::str(san);
        return out;
      },
      "How the engine was built: compiler, build type, CUDA kernels compiled in, sanitizers");

  m.def(
      "cuda_calls",
      [] {
#ifdef SMDCCL_WITH_CUDA
        return smdccl::gCudaCalls.load();
#else
        return uint64_t{0};
#endif
      },
      "CUDA and NCCL calls smdccl made in this process (each checked call, kernel launch and "
      "status query); read around a collective for what it costs the driver");

  m.def(
      "nccl_library",
      [] {
        std::map<std::string, py::object> out;
        std::string why;
        const smdccl::NcclLibrary* lib = smdccl::NcclLibrary::get(&why);
        out["loaded"] = py::bool_(lib != nullptr);
        out["version"] = py::str(lib ? lib->versionString() : "");
        out["path"] = py::str(lib ? lib->path() : "");
        out["why"] = py::str(why);
        if (lib) {
          smdccl::NcclUniqueId id = lib->uniqueId();
          out["unique_id"] = py::bytes(id.bytes, sizeof(id.bytes));
        }
        return out;
      },
      "The NCCL this process would use for CUDA collectives inside a node: loaded, version, "
      "path, why not; unique_id: a fresh ncclUniqueId (no GPU needed)");

  m.def(
      "reduce_isa", [] { return std::string(smdccl::reduceIsa()); },
      "Instruction set the CPU reductions use on this machine");
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "smdccl engine: a two-level collective-communication backend for torch.distributed";
  translateErrors();
  bindBackend(m);
  bindGroupCreation(m);
  bindSettings(m);
  bindModel(m);
  bindBuild(m);
}
