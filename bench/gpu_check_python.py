"""Python on the GPU (bench/gpu_check.sh): training and evaluation on cuda against the CPU, and a run that exhausts the GPU raising DeviceError."""
import fanout, json, tempfile, os
print("CUDA_BUILT", fanout.CUDA_BUILT)
cfg = {"model": "sage", "epochs": 2}
g = fanout.train(cfg, device="cuda", save_model="/tmp/sage.safetensors")
c = fanout.train(cfg, device="cpu")
print("device", g["device"])
print("losses gpu", [e["loss"] for e in g["epochs"]], "cpu", [e["loss"] for e in c["epochs"]])
print("test gpu", g["test_acc"], "cpu", c["test_acc"])
print("evaluate cuda", fanout.evaluate("/tmp/sage.safetensors", device="cuda"),
      "cpu", fanout.evaluate("/tmp/sage.safetensors", device="cpu"))
try:
    fanout.train({"dataset": "/tmp/products", "model": "sage", "epochs": 1, "hidden": 8192,
                  "batch_size": 200000, "fanouts": [25, 25]}, device="cuda")
    print("no error?")
except fanout.DeviceError as e:
    print("DeviceError:", str(e)[:300])
except Exception as e:
    print("other error", type(e).__name__, str(e)[:300])
