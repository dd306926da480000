# Ansible managed
# CUDA 12.8 for login shells; added only once, so sourcing twice is harmless.
CUDA_HOME=/usr/local/cuda-12.8
export CUDA_HOME
case ":${PATH}:" in
    *":${CUDA_HOME}/bin:"*) ;;
    *) PATH="${CUDA_HOME}/bin${PATH:+:${PATH}}" ;;
esac
export PATH
