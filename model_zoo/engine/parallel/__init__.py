"""Running one engine over several processes (see :mod:`hwplug.model_zoo.llm_parallel`).

- :mod:`.rendezvous`: torchrun's ``env://`` description of a rank, the platform's
  torch.distributed backend, and the process groups (model collectives; driver commands);
- :mod:`.binding`: the CPUs ``HWPLUG_CPU_BIND`` gives each rank, and binding a thread;
- :mod:`.processes`: spawned workers, watched and always reaped;
- :mod:`.commands`: the driver/worker protocol and the driver's model proxy;
- :mod:`.tensor`: one rank of a tensor-parallel engine (drive or serve, fail, stop);
- :mod:`.replicas`: data-parallel replicas and how requests are dealt to them.
"""
