def my_sgd(problem, batch_size, lr, epochs, seed=0):
    """Mini-batch SGD on the toy; returns the (w, b) at the start and after every step."""
    rng = np.random.default_rng(seed)
    params = np.array(sgd_toy.START, dtype=float)
    path = [params]
    # Your code: each epoch, rng.permutation(problem.n_samples), cut into consecutive
    # batches of batch_size indices; for each batch, params = params - lr * (the gradient
    # of the loss on that batch: problem.gradient(params, batch)); append params to path.
    raise NotImplementedError("write the loop of mini-batch SGD")
    return path
