/*
 * Library entry points of libmsar_plugins.so.
 *
 * - getCreators / setLoggerFinder: what IPluginRegistry::loadLibrary (and so
 *   `trtexec --dynamicPlugins`, engines with serialised plugin libraries)
 *   looks up.
 * - REGISTER_TENSORRT_PLUGIN: static registration when the library is simply
 *   dlopen-ed (ctypes.CDLL, `polygraphy --plugins`, `trtexec --staticPlugins`).
 *
 * TensorRT refuses to register a creator twice, and loadLibrary dlopens the
 * library (running the static registrars) before it calls getCreators. So
 * the build makes two flavours from the same sources (CMakeLists.txt). It sits
 * above common/ and the plugin folders because it names both plugins:
 * libmsar_plugins.so with MSAR_STATIC_REGISTRATION=1 for dlopen users, and
 * libmsar_plugins_dynamic.so without it for loadLibrary users. Both export
 * getCreators.
 */
#include "NvInferRuntime.h"

#include "common/msarPluginUtils.h"

#include "msarDepthRetrievalPlugin/depthRetrievalPlugin.h"
#include "msarFusedMixerPlugin/fusedMixerPlugin.h"

#include <cstdio>
#include <mutex>

namespace msar
{
namespace
{
std::mutex gLoggerMutex;
nvinfer1::ILoggerFinder* gLoggerFinder{nullptr};
} // namespace

void setLoggerFinder(nvinfer1::ILoggerFinder* finder) noexcept
{
    std::lock_guard<std::mutex> lock(gLoggerMutex);
    if (gLoggerFinder == nullptr && finder != nullptr)
    {
        gLoggerFinder = finder;
    }
}

void logError(char const* where, char const* what) noexcept
{
    try
    {
        std::string const msg = std::string("[msar_plugins] ") + where + ": " + what;
        nvinfer1::ILogger* logger = nullptr;
        {
            std::lock_guard<std::mutex> lock(gLoggerMutex);
            logger = gLoggerFinder != nullptr ? gLoggerFinder->findLogger() : nullptr;
        }
        if (logger != nullptr)
        {
            logger->log(nvinfer1::ILogger::Severity::kERROR, msg.c_str());
        }
        else
        {
            std::fprintf(stderr, "%s\n", msg.c_str());
        }
    }
    catch (...)
    {
        std::fprintf(stderr, "[msar_plugins] %s: %s\n", where, what);
    }
}

} // namespace msar

// The library's entry points stay visible when the build hides everything else
// (TENSORRTAPI is empty outside TensorRT's own build).
#define MSAR_PLUGIN_API __attribute__((visibility("default")))

#if MSAR_STATIC_REGISTRATION
REGISTER_TENSORRT_PLUGIN(FusedMixerPluginCreator);
REGISTER_TENSORRT_PLUGIN(DepthRetrievalPluginCreator);
#endif

extern "C" MSAR_PLUGIN_API nvinfer1::IPluginCreatorInterface* const* getCreators(int32_t& nbCreators)
{
    static FusedMixerPluginCreator sFusedMixer;
    static DepthRetrievalPluginCreator sDepthRetrieval;
    static nvinfer1::IPluginCreatorInterface* const kCreators[] = {&sFusedMixer, &sDepthRetrieval};
    nbCreators = 2;
    return kCreators;
}

extern "C" MSAR_PLUGIN_API void setLoggerFinder(nvinfer1::ILoggerFinder* finder)
{
    msar::setLoggerFinder(finder);
}
